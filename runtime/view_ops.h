// The view-class ops on tensors of any device: broadcast_in_dim, slice and permute restride (no
// copy); cat (unless its parts already lie end to end in one storage) and stride_order copy into a
// fresh tensor (through Tensor::copyFrom, which runs the strided copy kernel on CUDA). The CPU and
// CUDA view executors both call these.
#pragma once
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace meshfuse {

// Output axis dims[i] takes input axis i (its stride, or 0 where an extent of 1 broadcasts); the
// other output axes are new, with stride 0. `what` names the op in errors.
Tensor broadcastInDimView(const Tensor& x, const std::vector<int64_t>& dims, const std::vector<int64_t>& out_shape,
                          const std::string& what);
// x[starts[d] : starts[d] + steps[d] * out_shape[d] : steps[d]] on every axis d.
Tensor sliceView(const Tensor& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& steps,
                 const std::vector<int64_t>& out_shape);
// The tensors laid end to end along `dim`: a view of their storage where they already lie so there,
// else a fresh contiguous tensor on their device.
Tensor concatenate(const std::vector<Tensor>& parts, int64_t dim, const std::vector<int64_t>& out_shape);
// A copy of x whose axis i has the stride_order[i]-th smallest stride (nvFuser's convention:
// {rank-1, ..., 1, 0} is row-major).
Tensor strideOrdered(const Tensor& x, const std::vector<int64_t>& stride_order);

}  // namespace meshfuse

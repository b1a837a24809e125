// View exprs on device tensors: permute, broadcast_in_dim and slice restride the input (no copy);
// reshape is a view of a contiguous input and a copy (the strided copy kernel) of any other;
// stride_order copies (cat, with several inputs, is runtime/view_ops.h's concatenate).
#pragma once
#include <vector>

#include "ir/ir.h"
#include "runtime/tensor.h"

namespace meshfuse::cuda {

Tensor applyView(const Expr& expr, const Tensor& input, const std::vector<int64_t>& out_shape);

}  // namespace meshfuse::cuda

// Backends move flat buffers of team-size blocks; tensors are gathered or scattered along any axis.
// These two functions convert between the two layouts (zero-copy when the axis is effectively the
// leading one of a contiguous tensor).
#pragma once
#include "runtime/tensor.h"

namespace meshfuse {

// A contiguous tensor of shape [parts, ...t's shape with extent/parts at axis] whose block j is
// t's j-th chunk along `axis`.
Tensor blocksAlong(const Tensor& t, int axis, int64_t parts);

// The inverse: `blocks` of shape [parts, ...block shape] into a tensor of `out_shape` whose j-th
// chunk along `axis` is block j.
Tensor unblockAlong(const Tensor& blocks, int axis, int64_t parts, const std::vector<int64_t>& out_shape);

}  // namespace meshfuse

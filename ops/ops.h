// Building blocks of a definition: each function appends one Expr to the operands' fusion and
// returns its result, with the output shape and dtype inferred (numpy-style promotion).
#pragma once
#include <vector>

#include "ir/ir.h"

namespace meshfuse::ops {

TensorView* unary(OpType op, TensorView* x);
// Either operand may be a Scalar; at least one is a TensorView.
TensorView* binary(OpType op, Val* a, Val* b);
// where(cond, a, b): a where cond is true, else b; any operand may be a Scalar, one is a TensorView.
TensorView* where(Val* cond, Val* a, Val* b);
TensorView* cast(TensorView* x, DataType dtype);
TensorView* set(TensorView* x);
// dtype of sum: Int for integral/bool inputs (as numpy), else the input's.
TensorView* reduction(OpType op, TensorView* x, const std::vector<int64_t>& axes, bool keepdim);
TensorView* broadcastInDim(TensorView* x, std::vector<int64_t> shape, std::vector<int64_t> broadcast_dims);
TensorView* reshape(TensorView* x, std::vector<int64_t> shape);
TensorView* permute(TensorView* x, std::vector<int64_t> dims);
// x[start:end:step] per axis (nvFuser's slice); `strides` empty means steps of 1.
TensorView* slice(TensorView* x, std::vector<int64_t> starts, std::vector<int64_t> ends, std::vector<int64_t> strides);
TensorView* cat(const std::vector<TensorView*>& tensors, int64_t dim);
// A copy of x whose memory is laid out with axis order[i] having the i-th largest... as nvFuser:
// stride_order[i] is the rank of axis i's stride (rank-1 = outermost, 0 = innermost).
TensorView* strideOrder(TensorView* x, std::vector<int64_t> stride_order);
// A tensor of `shape` filled with `fill_value` (a Scalar), of `dtype`.
TensorView* full(std::vector<int64_t> shape, Val* fill_value, DataType dtype);
// Counter-based (Philox 4x32-10) random tensors: element i of the global tensor depends only on
// (seed, offset, i), so CPU and CUDA agree and a shard holds its block of the one global tensor.
// A Philox counter serves four Float uniforms, two Double uniforms or Float normals, or one Double
// normal (runtime/philox.h).
// seed/offset nullptr: each execution draws a fresh pair.
TensorView* uniform(Val* minval, Val* maxval, std::vector<int64_t> shape, DataType dtype, Val* seed = nullptr,
                    Val* offset = nullptr);
TensorView* normal(Val* mean, Val* std, std::vector<int64_t> shape, DataType dtype, Val* seed = nullptr,
                   Val* offset = nullptr);
// (variance, mean) over `axes`, variance divided by N - correction; built from sums and pointwise
// ops, so it fuses into one normalization segment with its producers and consumers.
std::pair<TensorView*, TensorView*> varMean(TensorView* x, std::vector<int64_t> axes, int64_t correction, bool keepdim);
TensorView* matmul(TensorView* a, TensorView* b);
TensorView* linear(TensorView* x, TensorView* weight, TensorView* bias = nullptr);

// The dtype an op produces from its operands' dtypes.
DataType resultType(OpType op, const std::vector<Val*>& inputs, const ExprAttributes& attrs);

}  // namespace meshfuse::ops

// Building blocks of a definition: each function appends one Expr to the operands' fusion and
// returns its result, with the output shape and dtype inferred (numpy-style promotion).
#pragma once
#include <vector>

#include "ir/ir.h"

namespace meshfuse::ops {

TensorView* unary(OpType op, TensorView* x);
// Either operand may be a Scalar; at least one is a TensorView.
TensorView* binary(OpType op, Val* a, Val* b);
TensorView* cast(TensorView* x, DataType dtype);
TensorView* set(TensorView* x);
// dtype of sum: Int for integral/bool inputs (as numpy), else the input's.
TensorView* reduction(OpType op, TensorView* x, std::vector<int64_t> axes, bool keepdim);
TensorView* broadcastInDim(TensorView* x, std::vector<int64_t> shape, std::vector<int64_t> broadcast_dims);
TensorView* reshape(TensorView* x, std::vector<int64_t> shape);
TensorView* permute(TensorView* x, std::vector<int64_t> dims);
TensorView* matmul(TensorView* a, TensorView* b);
TensorView* linear(TensorView* x, TensorView* weight, TensorView* bias = nullptr);

// The dtype an op produces from its operands' dtypes.
DataType resultType(OpType op, const std::vector<Val*>& inputs, const ExprAttributes& attrs);

}  // namespace meshfuse::ops

#include "ops/ops.h"

#include "ops/shape_inference.h"

namespace meshfuse::ops {

namespace {
Fusion* fusionOf(const std::vector<Val*>& inputs, OpType op) {
  Fusion* f = nullptr;
  for (Val* v : inputs) {
    if (v == nullptr) throw UserError(toString(op) + ": an operand is None");
    if (f == nullptr) f = v->fusion();
    else if (v->fusion() != f)
      throw UserError(toString(op) + ": " + v->name() + " belongs to another FusionDefinition");
  }
  return f;
}

TensorView* build(OpType op, std::vector<Val*> inputs, ExprAttributes attrs = {}) {
  Fusion* f = fusionOf(inputs, op);
  std::vector<std::vector<int64_t>> shapes;
  for (Val* v : inputs) shapes.push_back(v->isTensor() ? static_cast<TensorView*>(v)->shape() : std::vector<int64_t>{});
  std::vector<int64_t> shape = inferShape(op, attrs, inputs, shapes);
  TensorView* out = f->newTensor(resultType(op, inputs, attrs), shape);
  f->newExpr(op, std::move(inputs), {out}, std::move(attrs));
  return out;
}

bool producesFloat(OpType op) {
  switch (op) {
    case OpType::Exp: case OpType::Log: case OpType::Sqrt: case OpType::Sigmoid:
    case OpType::Tanh: case OpType::Gelu: case OpType::Div: case OpType::Mean:
      return true;
    default: return false;
  }
}
}  // namespace

DataType resultType(OpType op, const std::vector<Val*>& inputs, const ExprAttributes& attrs) {
  if (op == OpType::Cast) return attrs.cast_to;
  DataType t = inputs[0]->dtype();
  // A scalar operand does not widen a tensor (x_half * 2.0 stays Half), as in torch.
  bool have_tensor = false;
  for (Val* v : inputs) {
    if (!v->isTensor()) continue;
    t = have_tensor ? promoteTypes(t, v->dtype()) : v->dtype();
    have_tensor = true;
  }
  for (Val* v : inputs)
    if (!v->isTensor() && isFloatingPoint(v->dtype()) && !isFloatingPoint(t)) t = DataType::Float;
  if (producesFloat(op) && !isFloatingPoint(t)) return DataType::Float;
  if (op == OpType::Sum && !isFloatingPoint(t)) return DataType::Int;
  if ((op == OpType::Add || op == OpType::Sub || op == OpType::Mul) && t == DataType::Bool) return DataType::Int;
  return t;
}

TensorView* unary(OpType op, TensorView* x) {
  if (!isUnary(op)) throw UserError(toString(op) + " is not a unary op");
  return build(op, {x});
}

TensorView* binary(OpType op, Val* a, Val* b) {
  if (!isBinary(op)) throw UserError(toString(op) + " is not a binary op");
  if (a && b && !a->isTensor() && !b->isTensor()) throw UserError(toString(op) + ": at least one operand must be a tensor");
  return build(op, {a, b});
}

TensorView* cast(TensorView* x, DataType dtype) {
  ExprAttributes attrs;
  attrs.cast_to = dtype;
  return build(OpType::Cast, {x}, attrs);
}

TensorView* set(TensorView* x) { return build(OpType::Set, {x}); }

TensorView* reduction(OpType op, TensorView* x, std::vector<int64_t> axes, bool keepdim) {
  if (!isReduction(op)) throw UserError(toString(op) + " is not a reduction");
  if (x == nullptr) throw UserError(toString(op) + ": operand is None");
  ExprAttributes attrs;
  attrs.axes = normalizeAxes(axes, x->ndim(), toString(op) + "(" + x->name() + ")");
  attrs.keepdim = keepdim;
  return build(op, {x}, attrs);
}

TensorView* broadcastInDim(TensorView* x, std::vector<int64_t> shape, std::vector<int64_t> broadcast_dims) {
  ExprAttributes attrs;
  attrs.shape = std::move(shape);
  attrs.axes = std::move(broadcast_dims);
  return build(OpType::BroadcastInDim, {x}, attrs);
}

TensorView* reshape(TensorView* x, std::vector<int64_t> shape) {
  ExprAttributes attrs;
  attrs.shape = std::move(shape);
  return build(OpType::Reshape, {x}, attrs);
}

TensorView* permute(TensorView* x, std::vector<int64_t> dims) {
  ExprAttributes attrs;
  attrs.axes = std::move(dims);
  if (x) attrs.axes = normalizeAxes(attrs.axes, x->ndim(), "permute(" + x->name() + ")");
  return build(OpType::Permute, {x}, attrs);
}

TensorView* matmul(TensorView* a, TensorView* b) { return build(OpType::Matmul, {a, b}); }

TensorView* linear(TensorView* x, TensorView* weight, TensorView* bias) {
  std::vector<Val*> inputs{x, weight};
  if (bias) inputs.push_back(bias);
  return build(OpType::Linear, inputs);
}

}  // namespace meshfuse::ops

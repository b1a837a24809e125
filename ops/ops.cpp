#include "ops/ops.h"

#include <algorithm>

#include "ops/shape_inference.h"
#include "runtime/tensor.h"

namespace meshfuse::ops {

namespace {
Fusion* fusionOf(const std::vector<Val*>& inputs, OpType op) {
  Fusion* f = nullptr;
  for (Val* v : inputs) {
    if (v == nullptr) throw UserError(toString(op) + ": an operand is None");
    if (f == nullptr)
      f = v->fusion();
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
    case OpType::Exp:
    case OpType::Log:
    case OpType::Sqrt:
    case OpType::Sigmoid:
    case OpType::Tanh:
    case OpType::Gelu:
    case OpType::Div:
    case OpType::Mean:
    case OpType::Rsqrt:
    case OpType::Reciprocal:
    case OpType::Erf:
    case OpType::Silu: return true;
    default: return false;
  }
}
}  // namespace

DataType resultType(OpType op, const std::vector<Val*>& inputs, const ExprAttributes& attrs) {
  if (op == OpType::Cast || isCreation(op)) return attrs.cast_to;
  if (isComparison(op) || isLogical(op)) return DataType::Bool;
  if (op == OpType::Where) {
    // Promoted as a binary op of the two values; two number values give Float for floats (torch).
    DataType t = resultType(OpType::Max, {inputs[1], inputs[2]}, attrs);
    if (!inputs[1]->isTensor() && !inputs[2]->isTensor() && t == DataType::Double) return DataType::Float;
    return t;
  }
  DataType t = inputs[0]->dtype();
  // A scalar operand does not widen a tensor within its kind (x_half * 2.0 stays Half, x_int32 + 2
  // stays Int32), but lifts it to a higher kind (bool < integer < floating), as in torch: a Bool
  // tensor and an integer scalar give Int (the scalar 2 was cast to True), a floating scalar Float.
  // Without a tensor (where's two values), the scalars promote among themselves.
  bool have_tensor = false;
  for (Val* v : inputs) {
    if (!v->isTensor()) continue;
    t = have_tensor ? promoteTypes(t, v->dtype()) : v->dtype();
    have_tensor = true;
  }
  for (Val* v : inputs) {
    if (v->isTensor()) continue;
    if (!have_tensor)
      t = promoteTypes(t, v->dtype());
    else if (isFloatingPoint(v->dtype()) && !isFloatingPoint(t))
      t = DataType::Float;
    else if (t == DataType::Bool && v->dtype() != DataType::Bool)
      t = DataType::Int;
  }
  if (producesFloat(op) && !isFloatingPoint(t)) return DataType::Float;
  if (op == OpType::Sum && !isFloatingPoint(t)) return DataType::Int;
  if ((op == OpType::Add || op == OpType::Sub || op == OpType::Mul) && t == DataType::Bool) return DataType::Int;
  return t;
}

TensorView* unary(OpType op, TensorView* x) {
  if (!isUnary(op)) throw UserError(toString(op) + " is not a unary op");
  // numpy and torch refuse it too: -True is not a Bool (it returned x unchanged).
  if (op == OpType::Neg && x != nullptr && x->dtype() == DataType::Bool)
    throw UserError("neg: " + x->name() + " is Bool, which has no negation; use logical_not(" + x->name() +
                    ") to flip it, or cast it to a number first");
  return build(op, {x});
}

TensorView* binary(OpType op, Val* a, Val* b) {
  if (!isBinary(op)) throw UserError(toString(op) + " is not a binary op");
  if (a && b && !a->isTensor() && !b->isTensor())
    throw UserError(toString(op) + ": at least one operand must be a tensor");
  return build(op, {a, b});
}

TensorView* where(Val* cond, Val* a, Val* b) {
  if (cond && a && b && !cond->isTensor() && !a->isTensor() && !b->isTensor())
    throw UserError("where: at least one operand must be a tensor");
  if (cond && cond->dtype() != DataType::Bool)
    throw UserError("where: the condition " + cond->name() + " must be Bool, got " + toString(cond->dtype()) +
                    " (compare it first, e.g. with ne(x, 0))");
  return build(OpType::Where, {cond, a, b});
}

TensorView* cast(TensorView* x, DataType dtype) {
  ExprAttributes attrs;
  attrs.cast_to = dtype;
  return build(OpType::Cast, {x}, attrs);
}

TensorView* set(TensorView* x) { return build(OpType::Set, {x}); }

TensorView* reduction(OpType op, TensorView* x, const std::vector<int64_t>& axes, bool keepdim) {
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

TensorView* slice(TensorView* x, std::vector<int64_t> starts, std::vector<int64_t> ends, std::vector<int64_t> strides) {
  ExprAttributes attrs;
  attrs.axes = std::move(starts);
  attrs.shape = std::move(ends);
  attrs.strides = std::move(strides);
  if (x && attrs.strides.empty()) attrs.strides.assign(static_cast<size_t>(x->ndim()), 1);
  return build(OpType::Slice, {x}, attrs);
}

TensorView* cat(const std::vector<TensorView*>& tensors, int64_t dim) {
  if (tensors.empty()) throw UserError("cat: needs at least one tensor");
  for (const TensorView* t : tensors)
    if (t == nullptr) throw UserError("cat: a tensor is None");
  ExprAttributes attrs;
  attrs.axes = normalizeAxes({dim}, tensors[0]->ndim(), "cat");
  return build(OpType::Cat, std::vector<Val*>(tensors.begin(), tensors.end()), attrs);
}

TensorView* strideOrder(TensorView* x, std::vector<int64_t> stride_order) {
  ExprAttributes attrs;
  attrs.axes = std::move(stride_order);
  return build(OpType::StrideOrder, {x}, attrs);
}

namespace {
ExprAttributes creationAttrs(OpType op, std::vector<int64_t> shape, DataType dtype) {
  for (int64_t e : shape)
    if (e < 0) throw UserError(toString(op) + ": shape " + shapeToString(shape) + " needs known extents (>= 0)");
  ExprAttributes attrs;
  attrs.shape = std::move(shape);
  attrs.cast_to = dtype;
  return attrs;
}

void checkNumber(OpType op, const Val* v, const char* what) {
  if (v == nullptr) throw UserError(toString(op) + ": " + what + " is None");
  if (v->isTensor()) throw UserError(toString(op) + ": " + what + " must be a scalar, got tensor " + v->name());
}

TensorView* random(OpType op, Val* a, Val* b, std::vector<int64_t> shape, DataType dtype, Val* seed, Val* offset) {
  const bool is_uniform = op == OpType::Uniform;
  checkNumber(op, a, is_uniform ? "minval" : "mean");
  checkNumber(op, b, is_uniform ? "maxval" : "std");
  if (!isFloatingPoint(dtype)) throw UserError(toString(op) + ": dtype must be floating point, got " + toString(dtype));
  if ((seed == nullptr) != (offset == nullptr))
    throw UserError(toString(op) + ": give both rng_seed and rng_offset, or neither");
  ExprAttributes attrs = creationAttrs(op, std::move(shape), dtype);
  Fusion* f = a->fusion();
  if (seed == nullptr) {
    // Bound by the evaluator at each execution (the same pair on every rank).
    attrs.fresh_rng = true;
    seed = f->newScalar(DataType::Int, std::nullopt);
    offset = f->newScalar(DataType::Int, std::nullopt);
  } else {
    checkNumber(op, seed, "rng_seed");
    checkNumber(op, offset, "rng_offset");
  }
  return build(op, {a, b, seed, offset}, attrs);
}
}  // namespace

TensorView* full(std::vector<int64_t> shape, Val* fill_value, DataType dtype) {
  checkNumber(OpType::Full, fill_value, "fill_value");
  return build(OpType::Full, {fill_value}, creationAttrs(OpType::Full, std::move(shape), dtype));
}

TensorView* uniform(Val* minval, Val* maxval, std::vector<int64_t> shape, DataType dtype, Val* seed, Val* offset) {
  return random(OpType::Uniform, minval, maxval, std::move(shape), dtype, seed, offset);
}

TensorView* normal(Val* mean, Val* std, std::vector<int64_t> shape, DataType dtype, Val* seed, Val* offset) {
  return random(OpType::Normal, mean, std, std::move(shape), dtype, seed, offset);
}

std::pair<TensorView*, TensorView*> varMean(TensorView* x, std::vector<int64_t> axes, int64_t correction,
                                            bool keepdim) {
  if (x == nullptr) throw UserError("var_mean: operand is None");
  if (!isFloatingPoint(x->dtype()))
    throw UserError("var_mean: " + x->name() + " must be floating point, got " + toString(x->dtype()));
  axes = normalizeAxes(axes, x->ndim(), "var_mean(" + x->name() + ")");
  if (correction < 0) throw UserError("var_mean: correction must be >= 0, got " + std::to_string(correction));
  Fusion* f = x->fusion();
  // Two passes over the data (mean, then the centred squares): exact enough in fp32 where a
  // one-pass E[x^2] - E[x]^2 is not, and both reductions fuse into one segment.
  TensorView* mean = reduction(OpType::Mean, x, axes, keepdim);
  TensorView* mean_full = mean;
  if (!keepdim) {
    // To x's rank with extent 1 on the reduced axes (a symbolic extent there could not be
    // resolved), then broadcast by the subtraction.
    std::vector<int64_t> kept, shape = x->shape();
    for (int64_t d = 0; d < x->ndim(); ++d)
      if (std::find(axes.begin(), axes.end(), d) == axes.end())
        kept.push_back(d);
      else
        shape[d] = 1;
    mean_full = broadcastInDim(mean, shape, kept);
  }
  TensorView* squares = unary(OpType::Square, binary(OpType::Sub, x, mean_full));
  // The count N of reduced elements: known at definition time, or (symbolic extents, nvFuser's
  // usual define_tensor([-1, -1])) only at execution, where a mean divides by it.
  int64_t n = 1;
  for (int64_t a : axes) n = (n < 0 || x->shape()[a] < 0) ? -1 : n * x->shape()[a];
  if (n < 0 && correction == 0) return {reduction(OpType::Mean, squares, axes, keepdim), mean};
  if (n < 0) {  // sum / (N - correction), with N counted at execution as a sum of ones
    TensorView* ones =
        where(binary(OpType::Eq, x, x), f->newScalar(DataType::Double, 1.0), f->newScalar(DataType::Double, 1.0));
    // Counted in Float (exact to 2^24; Half is exact only to 2048), Double for Double.
    if (x->dtype() == DataType::Double) ones = cast(ones, DataType::Double);
    TensorView* count = reduction(OpType::Sum, ones, axes, keepdim);
    // max(N - correction, 0), as the static branch below and torch: a correction beyond N divides by
    // zero (inf, or NaN over an empty axis), never by a negative count (a negative variance).
    TensorView* denom =
        binary(OpType::Max, binary(OpType::Sub, count, f->newScalar(DataType::Double, static_cast<double>(correction))),
               f->newScalar(DataType::Double, 0.0));
    TensorView* var = binary(OpType::Div, reduction(OpType::Sum, squares, axes, keepdim), denom);
    return {var->dtype() == x->dtype() ? var : cast(var, x->dtype()), mean};
  }
  TensorView* ssq = reduction(OpType::Sum, squares, axes, keepdim);
  const double denom = static_cast<double>(std::max<int64_t>(n - correction, 0));
  TensorView* var = binary(OpType::Div, ssq, f->newScalar(DataType::Double, denom));
  return {var, mean};
}

TensorView* matmul(TensorView* a, TensorView* b) { return build(OpType::Matmul, {a, b}); }

TensorView* linear(TensorView* x, TensorView* weight, TensorView* bias) {
  std::vector<Val*> inputs{x, weight};
  if (bias) inputs.push_back(bias);
  return build(OpType::Linear, inputs);
}

}  // namespace meshfuse::ops

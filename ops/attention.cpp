#include "ops/attention.h"

#include <cmath>
#include <limits>

#include "runtime/tensor.h"

namespace meshfuse::ops {

namespace {

std::string axisName(int64_t axis) {
  static const char* names[] = {"batch", "heads", "sequence", "head dim"};
  return axis >= 0 && axis < 4 ? names[axis] : "?";
}

void checkRank(OpType op, const Val* v, const std::vector<int64_t>& shape, size_t rank, const char* layout) {
  if (shape.size() != rank)
    throw UserError(toString(op) + ": " + v->name() + " must have rank " + std::to_string(rank) + " " + layout +
                    ", got shape " + shapeToString(shape));
}

// Extents `a` of x and `b` of y must agree when both are known.
void checkSame(OpType op, const Val* x, const std::vector<int64_t>& xs, int64_t a, const Val* y,
               const std::vector<int64_t>& ys, int64_t b) {
  if (xs[a] >= 0 && ys[b] >= 0 && xs[a] != ys[b])
    throw UserError(toString(op) + ": " + x->name() + " axis " + std::to_string(a) + " (" + axisName(a) + ", extent " +
                    std::to_string(xs[a]) + ") does not match " + y->name() + " axis " + std::to_string(b) + " (" +
                    axisName(b) + ", extent " + std::to_string(ys[b]) + ")");
}

// q, k, v: [b, h, s_q, d], [b, h, s_kv, d], [b, h, s_kv, d_v]. Returns out's shape [b, h, s_q, d_v].
std::vector<int64_t> checkQkv(OpType op, const Val* q, const Val* k, const Val* v, const std::vector<int64_t>& qs,
                              const std::vector<int64_t>& ks, const std::vector<int64_t>& vs) {
  checkRank(op, q, qs, 4, "[batch, heads, seq_q, head_dim]");
  checkRank(op, k, ks, 4, "[batch, heads, seq_kv, head_dim]");
  checkRank(op, v, vs, 4, "[batch, heads, seq_kv, head_dim_v]");
  for (int64_t a : {0, 1}) {
    checkSame(op, q, qs, a, k, ks, a);
    checkSame(op, q, qs, a, v, vs, a);
  }
  checkSame(op, k, ks, 2, v, vs, 2);
  checkSame(op, q, qs, 3, k, ks, 3);
  return {qs[0] >= 0 ? qs[0] : ks[0], qs[1] >= 0 ? qs[1] : ks[1], qs[2], vs[3]};
}

void checkDtypes(OpType op, const std::vector<const Val*>& same) {
  const DataType t = same.front()->dtype();
  if (!isFloatingPoint(t))
    throw UserError(toString(op) + ": " + same.front()->name() + " must be floating point, got " + toString(t));
  for (const Val* v : same)
    if (v->dtype() != t)
      throw UserError(toString(op) + ": operands must share one dtype: " + same.front()->name() + " is " + toString(t) +
                      " but " + v->name() + " is " + toString(v->dtype()));
}

Val* scalarOr(Fusion* f, Val* v, DataType dtype, double fallback, OpType op, const char* what) {
  if (v == nullptr) return f->newScalar(dtype, fallback);
  if (v->isTensor()) throw UserError(toString(op) + ": " + what + " must be a scalar, got tensor " + v->name());
  if (v->fusion() != f) throw UserError(toString(op) + ": " + what + " belongs to another FusionDefinition");
  if (auto* s = static_cast<Scalar*>(v); s->isConstant() && std::string(what) == "dropout_p") {
    const double p = *s->value();
    if (!(p >= 0.0 && p < 1.0))
      throw UserError(toString(op) + ": dropout_p must be in [0, 1), got " + std::to_string(p));
  }
  return v;
}

Fusion* fusionOfAll(OpType op, const std::vector<TensorView*>& tvs) {
  Fusion* f = nullptr;
  for (TensorView* t : tvs) {
    if (t == nullptr) throw UserError(toString(op) + ": a tensor operand is None");
    if (f == nullptr)
      f = t->fusion();
    else if (t->fusion() != f)
      throw UserError(toString(op) + ": " + t->name() + " belongs to another FusionDefinition");
  }
  return f;
}

constexpr double kDefaultScale = std::numeric_limits<double>::quiet_NaN();

}  // namespace

std::vector<std::vector<int64_t>> attentionShapes(OpType op, const std::vector<Val*>& in,
                                                  const std::vector<std::vector<int64_t>>& shapes) {
  if (op == OpType::SdpaFwd) {
    std::vector<int64_t> out =
        checkQkv(op, in[sdpa::kQ], in[sdpa::kK], in[sdpa::kV], shapes[sdpa::kQ], shapes[sdpa::kK], shapes[sdpa::kV]);
    return {out, {out[0], out[1], out[2]}, {}, {}};
  }
  using namespace sdpa;
  std::vector<int64_t> out = checkQkv(op, in[kBwdQ], in[kBwdK], in[kBwdV], shapes[kBwdQ], shapes[kBwdK], shapes[kBwdV]);
  for (size_t i : {kBwdGradOut, kBwdOut}) {
    checkRank(op, in[i], shapes[i], 4, "[batch, heads, seq_q, head_dim_v] (like sdpfa_fwd's out)");
    for (int64_t a = 0; a < 4; ++a)
      if (shapes[i][a] >= 0 && out[a] >= 0 && shapes[i][a] != out[a])
        throw UserError(toString(op) + ": " + in[i]->name() + " has shape " + shapeToString(shapes[i]) +
                        " but sdpfa_fwd's out for these q, v is " + shapeToString(out));
  }
  checkRank(op, in[kBwdLse], shapes[kBwdLse], 3, "[batch, heads, seq_q]");
  for (int64_t a = 0; a < 3; ++a)
    if (shapes[kBwdLse][a] >= 0 && out[a] >= 0 && shapes[kBwdLse][a] != out[a])
      throw UserError(toString(op) + ": log_sumexp " + in[kBwdLse]->name() + " has shape " +
                      shapeToString(shapes[kBwdLse]) +
                      ", expected [batch, heads, seq_q] = " + shapeToString({out[0], out[1], out[2]}));
  for (size_t i : {kBwdSeed, kBwdOffset})
    if (!shapes[i].empty())
      throw UserError(toString(op) + ": " + in[i]->name() + " must be a 0-dim tensor (sdpfa_fwd's philox_seed/offset)");
  return {shapes[kBwdQ], shapes[kBwdK], shapes[kBwdV]};
}

SdpaFwdResult sdpfaFwd(TensorView* q, TensorView* k, TensorView* v, Val* dropout_p, Val* is_causal, Val* scale) {
  const OpType op = OpType::SdpaFwd;
  Fusion* f = fusionOfAll(op, {q, k, v});
  checkDtypes(op, {q, k, v});
  std::vector<Val*> inputs{q, k, v};
  inputs.push_back(scalarOr(f, dropout_p, DataType::Double, 0.0, op, "dropout_p"));
  inputs.push_back(scalarOr(f, is_causal, DataType::Bool, 0.0, op, "is_causal"));
  inputs.push_back(scalarOr(f, scale, DataType::Double, kDefaultScale, op, "scale"));
  // Bound by the executor at each execution (the same pair on every rank), as for uniform().
  inputs.push_back(f->newScalar(DataType::Int, std::nullopt));
  inputs.push_back(f->newScalar(DataType::Int, std::nullopt));
  std::vector<std::vector<int64_t>> shapes;
  for (Val* x : inputs) shapes.push_back(x->isTensor() ? static_cast<TensorView*>(x)->shape() : std::vector<int64_t>{});
  auto out_shapes = attentionShapes(op, inputs, shapes);
  SdpaFwdResult r;
  r.out = f->newTensor(q->dtype(), out_shapes[0]);
  r.log_sumexp = f->newTensor(DataType::Float, out_shapes[1]);
  r.philox_seed = f->newTensor(DataType::Int, {});
  r.philox_offset = f->newTensor(DataType::Int, {});
  ExprAttributes attrs;
  attrs.fresh_rng = true;
  f->newExpr(op, inputs, {r.out, r.log_sumexp, r.philox_seed, r.philox_offset}, attrs);
  return r;
}

std::array<TensorView*, 3> sdpfaBwd(TensorView* grad_out, TensorView* q, TensorView* k, TensorView* v, TensorView* out,
                                    TensorView* log_sumexp, Val* dropout_p, Val* is_causal, TensorView* philox_seed,
                                    TensorView* philox_offset, Val* scale) {
  const OpType op = OpType::SdpaBwd;
  Fusion* f = fusionOfAll(op, {grad_out, q, k, v, out, log_sumexp, philox_seed, philox_offset});
  checkDtypes(op, {q, k, v, grad_out, out});
  if (log_sumexp->dtype() != DataType::Float)
    throw UserError(toString(op) + ": log_sumexp " + log_sumexp->name() + " must be Float, got " +
                    toString(log_sumexp->dtype()));
  for (TensorView* t : {philox_seed, philox_offset})
    if (t->dtype() != DataType::Int)
      throw UserError(toString(op) + ": " + t->name() +
                      " must be an Int tensor (sdpfa_fwd's philox_seed/offset), got " + toString(t->dtype()));
  std::vector<Val*> inputs{grad_out, q, k, v, out, log_sumexp};
  inputs.push_back(scalarOr(f, dropout_p, DataType::Double, 0.0, op, "dropout_p"));
  inputs.push_back(scalarOr(f, is_causal, DataType::Bool, 0.0, op, "is_causal"));
  inputs.push_back(philox_seed);
  inputs.push_back(philox_offset);
  inputs.push_back(scalarOr(f, scale, DataType::Double, kDefaultScale, op, "scale"));
  std::vector<std::vector<int64_t>> shapes;
  for (Val* x : inputs) shapes.push_back(x->isTensor() ? static_cast<TensorView*>(x)->shape() : std::vector<int64_t>{});
  auto out_shapes = attentionShapes(op, inputs, shapes);
  std::array<TensorView*, 3> grads{};
  for (int i = 0; i < 3; ++i) grads[i] = f->newTensor(q->dtype(), out_shapes[i]);
  f->newExpr(op, inputs, {grads[0], grads[1], grads[2]});
  return grads;
}

}  // namespace meshfuse::ops

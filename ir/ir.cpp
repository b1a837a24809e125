#include "ir/ir.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <unordered_set>

#include "runtime/element.h"
#include "runtime/tensor.h"

namespace meshfuse {

std::string Scalar::name() const { return "S" + std::to_string(id()); }

TensorView::TensorView(Fusion* f, int id, DataType dtype, std::vector<int64_t> shape, std::vector<bool> contiguity)
    : Val(f, id, Kind::Tensor, dtype), shape_(std::move(shape)), contiguity_(std::move(contiguity)) {
  if (contiguity_.empty()) contiguity_.assign(shape_.size(), true);
  if (contiguity_.size() != shape_.size())
    throw UserError("contiguity has " + std::to_string(contiguity_.size()) + " entries for a tensor of rank " +
                    std::to_string(shape_.size()));
  for (int64_t e : shape_)
    if (e < -1) throw UserError("extent " + std::to_string(e) + " is neither -1 (symbolic) nor a size");
  for (size_t i = 0; i < shape_.size(); ++i) loop_.push_back(LoopAxis{static_cast<int>(i)});
}

std::string TensorView::name() const { return "T" + std::to_string(id()); }

bool TensorView::isContiguous() const {
  return std::all_of(contiguity_.begin(), contiguity_.end(), [](bool c) { return c; });
}

// nvFuser keeps a reduction's reduced axes in its output's loop domain ([M, N, r{K}] for a matmul);
// meshfuse's loop domains hold only the logical axes, so an index ported from nvFuser can land one
// axis off (or out of range) on a reduction's output. Said where that error can come from.
std::string TensorView::loopDomainHint() const {
  const Expr* def = definition();
  if (def == nullptr) return "";
  const OpType op = def->op();
  if (!isReduction(op) && op != OpType::Matmul && op != OpType::Linear) return "";
  return " (" + name() + " is a " + toString(op) +
         "'s result: its loop domain has no reduced axes, unlike nvFuser's; see docs/nvfuser.md)";
}

void TensorView::split(int64_t loop_axis, int64_t factor, bool inner_split) {
  if (loop_axis < 0) loop_axis += static_cast<int64_t>(loop_.size());
  if (loop_axis < 0 || loop_axis >= static_cast<int64_t>(loop_.size()))
    throw UserError(name() + ": split of axis " + std::to_string(loop_axis) + " but the loop domain has " +
                    std::to_string(loop_.size()) + " axes" + loopDomainHint());
  if (factor <= 0) throw UserError(name() + ": split factor must be positive, got " + std::to_string(factor));
  LoopAxis& a = loop_[loop_axis];
  // A whole axis can be split, and so can the inner part of a first split (e.g. the device-local
  // extent of a sharded axis, to chunk it over streams); nothing deeper.
  if (a.part == LoopAxis::Part::Outer || a.level > 0)
    throw UserError(name() + ": loop axis " + std::to_string(loop_axis) +
                    " cannot be split again (split a whole axis or the inner part of a split)");
  int64_t extent = shape_[a.logical];
  if (a.part == LoopAxis::Part::Inner && extent >= 0) extent = a.outer_split ? extent / a.factor : a.factor;
  // Divisibility of symbolic extents is checked when they are bound.
  if (extent >= 0 && extent % factor != 0)
    throw UserError(name() + ": axis " + std::to_string(a.logical) + " of extent " + std::to_string(extent) +
                    " does not split evenly by " + std::to_string(factor));
  LoopAxis outer{a.logical, LoopAxis::Part::Outer, factor, !inner_split};
  LoopAxis inner{a.logical, LoopAxis::Part::Inner, factor, !inner_split};
  if (a.part == LoopAxis::Part::Inner) {
    for (LoopAxis* part : {&outer, &inner}) {
      part->level = 1;
      part->parent_factor = a.factor;
      part->parent_outer_split = a.outer_split;
    }
  }
  loop_[loop_axis] = outer;
  loop_.insert(loop_.begin() + loop_axis + 1, inner);
  scheduleChanged();
}

void TensorView::scheduleChanged() { ++fusion()->version_; }

void TensorView::parallelize(int64_t loop_axis, ParallelType p) {
  if (loop_axis < 0) loop_axis += static_cast<int64_t>(loop_.size());
  if (loop_axis < 0 || loop_axis >= static_cast<int64_t>(loop_.size()))
    throw UserError(name() + ": axis(" + std::to_string(loop_axis) + ") but the loop domain has " +
                    std::to_string(loop_.size()) + " axes" + loopDomainHint());
  LoopAxis& a = loop_[loop_axis];
  if (p != ParallelType::Serial) {
    if (a.part == LoopAxis::Part::Inner)
      throw UserError(name() + ": only the outer part of a split (or a whole axis) can be parallelized on " +
                      toString(p));
    if (isMeshParallel(p) && a.level > 0)
      throw UserError(name() + ": a mesh dimension must parallelize a first-level split of a logical axis");
    for (const LoopAxis& other : loop_)
      if (&other != &a && other.parallel == p)
        throw UserError(name() + ": two axes parallelized on " + toString(p) + loopDomainHint());
  }
  a.parallel = p;
  scheduleChanged();
}

int TensorView::shardedAxis(ParallelType p) const {
  for (const LoopAxis& a : loop_)
    if (a.parallel == p) return a.logical;
  return -1;
}

int64_t TensorView::partsAlong(ParallelType p, int64_t logical_extent) const {
  for (const LoopAxis& a : loop_) {
    if (a.parallel != p) continue;
    if (a.part == LoopAxis::Part::Whole) return logical_extent;
    int64_t base = logical_extent;
    if (a.level > 0) base = a.parent_outer_split ? logical_extent / a.parent_factor : a.parent_factor;
    return a.outer_split ? a.factor : base / a.factor;
  }
  return 1;
}

int TensorView::streamAxis() const { return shardedAxis(ParallelType::Stream); }

int64_t TensorView::streamChunks(int64_t logical_extent) const {
  return partsAlong(ParallelType::Stream, logical_extent);
}

bool TensorView::isSharded() const {
  return std::any_of(loop_.begin(), loop_.end(), [](const LoopAxis& a) { return isMeshParallel(a.parallel); });
}

std::string TensorView::loopToString() const {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < loop_.size(); ++i) {
    const LoopAxis& a = loop_[i];
    os << (i ? ", " : "");
    if (a.parallel != ParallelType::Serial) os << toString(a.parallel) << ":";
    os << "i" << a.logical;
    if (a.part != LoopAxis::Part::Whole) {
      bool given = (a.part == LoopAxis::Part::Outer) == a.outer_split;
      os << (a.part == LoopAxis::Part::Outer ? "o" : "i");
      if (given) os << "{" << a.factor << "}";
    }
  }
  os << "]";
  return os.str();
}

std::string toString(OpType op) {
  switch (op) {
    case OpType::Neg: return "neg";
    case OpType::Abs: return "abs";
    case OpType::Exp: return "exp";
    case OpType::Log: return "log";
    case OpType::Sqrt: return "sqrt";
    case OpType::Relu: return "relu";
    case OpType::Sigmoid: return "sigmoid";
    case OpType::Tanh: return "tanh";
    case OpType::Gelu: return "gelu";
    case OpType::Rsqrt: return "rsqrt";
    case OpType::Reciprocal: return "reciprocal";
    case OpType::Erf: return "erf";
    case OpType::Silu: return "silu";
    case OpType::Square: return "square";
    case OpType::LogicalNot: return "logical_not";
    case OpType::Add: return "add";
    case OpType::Sub: return "sub";
    case OpType::Mul: return "mul";
    case OpType::Div: return "div";
    case OpType::Max: return "maximum";
    case OpType::Min: return "minimum";
    case OpType::Pow: return "pow";
    case OpType::Lt: return "lt";
    case OpType::Le: return "le";
    case OpType::Gt: return "gt";
    case OpType::Ge: return "ge";
    case OpType::Eq: return "eq";
    case OpType::Ne: return "ne";
    case OpType::LogicalAnd: return "logical_and";
    case OpType::LogicalOr: return "logical_or";
    case OpType::Where: return "where";
    case OpType::Cast: return "cast";
    case OpType::Set: return "set";
    case OpType::Full: return "full";
    case OpType::Uniform: return "uniform";
    case OpType::Normal: return "normal";
    case OpType::Sum: return "sum";
    case OpType::ReduceMax: return "max";
    case OpType::Mean: return "mean";
    case OpType::BroadcastInDim: return "broadcast_in_dim";
    case OpType::Reshape: return "reshape";
    case OpType::Permute: return "permute";
    case OpType::Slice: return "slice";
    case OpType::Cat: return "cat";
    case OpType::StrideOrder: return "stride_order";
    case OpType::SdpaFwd: return "sdpfa_fwd";
    case OpType::SdpaBwd: return "sdpfa_bwd";
    case OpType::Matmul: return "matmul";
    case OpType::Linear: return "linear";
  }
  return "?";
}

bool isUnary(OpType op) { return op <= OpType::LogicalNot; }
bool isBinary(OpType op) { return op >= OpType::Add && op <= OpType::LogicalOr; }
bool isTernary(OpType op) { return op == OpType::Where; }
bool isComparison(OpType op) { return op >= OpType::Lt && op <= OpType::Ne; }
bool isLogical(OpType op) { return op == OpType::LogicalAnd || op == OpType::LogicalOr || op == OpType::LogicalNot; }
bool isExactOnIntegers(OpType op) {
  switch (op) {
    case OpType::Add:
    case OpType::Sub:
    case OpType::Mul:
    case OpType::Max:
    case OpType::Min:
    case OpType::Neg:
    case OpType::Abs:
    case OpType::Relu:
    case OpType::Cast:
    case OpType::Set:
    case OpType::Square:
    case OpType::LogicalNot:
    case OpType::LogicalAnd:
    case OpType::LogicalOr:
    case OpType::Where:
    case OpType::Full: return true;
    default: return isComparison(op);
  }
}

bool isCreation(OpType op) { return op == OpType::Full || op == OpType::Uniform || op == OpType::Normal; }
bool isRandom(OpType op) { return op == OpType::Uniform || op == OpType::Normal; }
bool isPointwise(OpType op) {
  return isUnary(op) || isBinary(op) || isTernary(op) || isCreation(op) || op == OpType::Cast || op == OpType::Set;
}
bool isReduction(OpType op) { return op == OpType::Sum || op == OpType::ReduceMax || op == OpType::Mean; }
bool isAttention(OpType op) { return op == OpType::SdpaFwd || op == OpType::SdpaBwd; }

TensorView* Expr::out() const { return static_cast<TensorView*>(outputs_.at(0)); }

TensorView* Expr::inputTv(size_t i) const {
  Val* v = inputs_.at(i);
  return v->isTensor() ? static_cast<TensorView*>(v) : nullptr;
}

namespace {
// A constant with its value to the last bit (%.17g): the text of a definition is what ranks compare
// to agree they run one program, and constants that differ in a later digit (2 against 2.0000001,
// a dropout probability) are different programs.
std::string constantToString(const Scalar* s) { return s->name() + "=" + exactText(*s->value()); }

std::string valToString(const Val* v) {
  if (v->isTensor()) {
    auto* tv = static_cast<const TensorView*>(v);
    std::string s = tv->name() + "_" + toString(tv->dtype()) + shapeToString(tv->shape());
    if (tv->hasDeviceMesh()) s += " " + tv->deviceMesh()->toString();
    if (tv->isSharded() || tv->streamAxis() >= 0) s += " loop" + tv->loopToString();
    if (tv->isPartial()) s += " partial";
    return s;
  }
  auto* s = static_cast<const Scalar*>(v);
  if (s->isConstant()) return constantToString(s);
  return s->name() + "_" + toString(s->dtype());
}
}  // namespace

std::string Expr::toString() const {
  std::ostringstream os;
  for (size_t i = 0; i < outputs_.size(); ++i) os << (i ? ", " : "") << valToString(outputs_[i]);
  os << " = " << meshfuse::toString(op_) << "(";
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const Val* in = inputs_[i];
    const bool constant = !in->isTensor() && static_cast<const Scalar*>(in)->isConstant();
    os << (i ? ", " : "") << (constant ? constantToString(static_cast<const Scalar*>(in)) : in->name());
  }
  if (!attrs_.axes.empty()) os << ", axes=" << shapeToString(attrs_.axes);
  if (!attrs_.shape.empty()) os << ", shape=" << shapeToString(attrs_.shape);
  if (!attrs_.strides.empty()) os << ", strides=" << shapeToString(attrs_.strides);
  if (attrs_.keepdim) os << ", keepdim=True";
  if (op_ == OpType::Cast || isCreation(op_)) os << ", dtype=" << meshfuse::toString(attrs_.cast_to);
  if (attrs_.fresh_rng) os << ", fresh_rng=True";
  os << ")";
  return os.str();
}

TensorView* Fusion::newTensor(DataType dtype, std::vector<int64_t> shape, std::vector<bool> contiguity) {
  auto tv = std::make_unique<TensorView>(this, static_cast<int>(vals_.size()), dtype, std::move(shape),
                                         std::move(contiguity));
  TensorView* raw = tv.get();
  vals_.push_back(std::move(tv));
  return raw;
}

std::string exactText(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

bool fitsInt32(double value) { return value >= -2147483648.0 && value <= 2147483647.0; }

bool isExactInteger(double value) {
  return std::isfinite(value) && value == std::trunc(value) && std::fabs(value) <= kExactIntegerLimit;
}

Scalar* Fusion::newScalar(DataType dtype, std::optional<double> value) {
  if (value && isIntegral(dtype) && !isExactInteger(*value))
    throw UserError("constant: an " + meshfuse::toString(dtype) +
                    " constant must be a whole number within 2**53, got " + exactText(*value));
  if (value && dtype == DataType::Int32 && !fitsInt32(*value))
    throw UserError("constant: an Int32 constant must be within [-2**31, 2**31), got " + exactText(*value));
  // Held as its dtype holds it (define_scalar(0.1, Float) is float's 0.1, (0.5, Bool) is true),
  // as numpy's np.float32(0.1) and torch's scalar tensors are: it used to stay the double given.
  if (value) value = representedAs(dtype, *value);
  auto s = std::make_unique<Scalar>(this, static_cast<int>(vals_.size()), dtype, value);
  Scalar* raw = s.get();
  vals_.push_back(std::move(s));
  return raw;
}

Expr* Fusion::newExpr(OpType op, std::vector<Val*> inputs, std::vector<Val*> outputs, ExprAttributes attrs) {
  for (Val* v : inputs)
    if (!owns(v))
      throw UserError(meshfuse::toString(op) + ": operand " + (v ? v->name() : "None") + " belongs to another fusion");
  auto e = std::make_unique<Expr>(static_cast<int>(exprs_.size()), op, std::move(inputs), std::move(outputs),
                                  std::move(attrs));
  Expr* raw = e.get();
  for (Val* v : raw->inputs()) v->uses_.push_back(raw);
  for (Val* v : raw->outputs()) v->definition_ = raw;
  exprs_.push_back(std::move(e));
  ++version_;
  return raw;
}

void Fusion::addInput(Val* v) {
  if (!owns(v)) throw UserError("add_input: " + v->name() + " belongs to another fusion");
  if (v->definition()) throw UserError("add_input: " + v->name() + " is computed by an expression");
  if (!isInput(v)) inputs_.push_back(v);
  ++version_;
}

void Fusion::addOutput(Val* v) {
  if (!owns(v))
    throw UserError("add_output: " + (v ? v->name() : std::string("None")) + " is not a tensor of this fusion");
  if (!v->isTensor()) throw UserError("add_output: " + v->name() + " is a scalar; outputs are tensors");
  // Once only: execute returns one tensor per output, and a repeat silently returned one value fewer
  // than add_output calls.
  if (isOutput(v)) {
    const auto at = std::find(outputs_.begin(), outputs_.end(), v) - outputs_.begin();
    throw UserError("add_output: " + v->name() + " is already output " + std::to_string(at) +
                    "; add each tensor once (fd.ops.set(t) makes a copy to return twice)");
  }
  outputs_.push_back(v);
  ++version_;
}

bool Fusion::isInput(const Val* v) const { return std::find(inputs_.begin(), inputs_.end(), v) != inputs_.end(); }
bool Fusion::isOutput(const Val* v) const { return std::find(outputs_.begin(), outputs_.end(), v) != outputs_.end(); }

std::vector<Expr*> Fusion::liveExprs() const {
  std::unordered_set<const Val*> needed(outputs_.begin(), outputs_.end());
  std::vector<Expr*> live;
  for (auto it = exprs_.rbegin(); it != exprs_.rend(); ++it) {
    Expr* e = it->get();
    bool used = std::any_of(e->outputs().begin(), e->outputs().end(), [&](Val* o) { return needed.count(o) > 0; });
    if (!used) continue;
    live.push_back(e);
    for (Val* in : e->inputs()) needed.insert(in);
  }
  std::reverse(live.begin(), live.end());
  return live;
}

std::string Fusion::toString() const {
  std::ostringstream os;
  os << "Fusion {\n  inputs:";
  for (Val* v : inputs_) os << "\n    " << valToString(v);
  os << "\n  exprs:";
  for (const auto& e : exprs_) os << "\n    " << e->toString();
  os << "\n  outputs:";
  for (Val* v : outputs_) os << " " << v->name();
  os << "\n}\n";
  return os.str();
}

std::unique_ptr<Fusion> Fusion::clone(std::vector<Val*>* map_out) const {
  auto copy = std::make_unique<Fusion>();
  std::vector<Val*> map(vals_.size(), nullptr);
  for (const auto& v : vals_) {
    if (v->isTensor()) {
      auto* tv = static_cast<const TensorView*>(v.get());
      TensorView* n = copy->newTensor(tv->dtype(), tv->shape(), tv->contiguity());
      if (tv->hasDeviceMesh()) n->setDeviceMesh(*tv->deviceMesh());
      n->setLoop(tv->loop());
      for (int i = 0; i < 3; ++i) n->setPartial(meshParallelType(i), tv->isPartial(meshParallelType(i)));
      map[v->id()] = n;
    } else {
      auto* s = static_cast<const Scalar*>(v.get());
      map[v->id()] = copy->newScalar(s->dtype(), s->value());
    }
  }
  for (const auto& e : exprs_) {
    std::vector<Val*> ins, outs;
    for (Val* v : e->inputs()) ins.push_back(map[v->id()]);
    for (Val* v : e->outputs()) outs.push_back(map[v->id()]);
    copy->newExpr(e->op(), ins, outs, e->attrs());
  }
  for (Val* v : inputs_) copy->inputs_.push_back(map[v->id()]);
  for (Val* v : outputs_) copy->outputs_.push_back(map[v->id()]);
  if (map_out) *map_out = std::move(map);
  return copy;
}

}  // namespace meshfuse

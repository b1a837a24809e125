#include "runtime/segment.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

namespace meshfuse {

std::string toString(Segment::Kind kind) {
  switch (kind) {
    case Segment::Kind::Pointwise: return "pointwise";
    case Segment::Kind::Reduction: return "reduction";
    case Segment::Kind::Normalization: return "normalization";
    case Segment::Kind::Matmul: return "matmul";
    case Segment::Kind::View: return "view";
    case Segment::Kind::Attention: return "attention";
  }
  return "?";
}

std::string toString(MatmulEpilogue::Kind kind) {
  switch (kind) {
    case MatmulEpilogue::Kind::None: return "none";
    case MatmulEpilogue::Kind::GeluTanh: return "gelu_tanh";
    case MatmulEpilogue::Kind::GeluTanhGrad: return "gelu_tanh_grad";
  }
  return "?";
}

std::string Segment::toString() const {
  std::ostringstream os;
  os << meshfuse::toString(kind) << "(";
  for (size_t i = 0; i < inputs.size(); ++i) os << (i ? ", " : "") << inputs[i]->name();
  os << ") -> (";
  for (size_t i = 0; i < outputs.size(); ++i) os << (i ? ", " : "") << outputs[i]->name();
  os << ") {";
  for (const Expr* e : exprs) os << " " << e->out()->name() << "=" << meshfuse::toString(e->op());
  os << " }";
  if (epilogue.kind != MatmulEpilogue::Kind::None) {
    os << " epilogue " << meshfuse::toString(epilogue.kind) << " -> " << epilogue.result->name();
    if (epilogue.aux) os << " (aux " << epilogue.aux->name() << ")";
    if (epilogue.bias_grad) os << " bias_grad -> " << epilogue.bias_grad->name();
  }
  return os.str();
}

Segment::Kind segmentKindOf(OpType op) {
  if (isPointwise(op)) return Segment::Kind::Pointwise;
  if (isReduction(op)) return Segment::Kind::Reduction;
  if (op == OpType::Matmul || op == OpType::Linear) return Segment::Kind::Matmul;
  if (isAttention(op)) return Segment::Kind::Attention;
  return Segment::Kind::View;
}

std::vector<Val*> inputsOf(const std::vector<const Expr*>& exprs) {
  std::unordered_set<const Val*> produced, seen;
  for (const Expr* e : exprs) produced.insert(e->outputs().begin(), e->outputs().end());
  std::vector<Val*> inputs;
  for (const Expr* e : exprs)
    for (Val* v : e->inputs())
      if (!produced.count(v) && seen.insert(v).second) inputs.push_back(v);
  return inputs;
}

std::vector<Segment> splitIntoParts(const Segment& seg) {
  std::vector<Segment> parts;
  for (const Expr* e : seg.exprs) {
    const Segment::Kind kind = segmentKindOf(e->op());
    if (kind == Segment::Kind::Pointwise && !parts.empty() && parts.back().kind == kind)
      parts.back().exprs.push_back(e);
    else
      parts.push_back(Segment{kind, {e}, {}, {}, seg.global_blocks, {}});
  }
  std::unordered_set<const Val*> seg_outputs(seg.outputs.begin(), seg.outputs.end());
  for (size_t i = 0; i < parts.size(); ++i) {
    parts[i].inputs = inputsOf(parts[i].exprs);
    for (const Expr* e : parts[i].exprs)
      for (Val* v : e->outputs()) {
        bool read_later = seg_outputs.count(v) > 0;
        for (size_t j = i + 1; j < parts.size() && !read_later; ++j)
          for (const Expr* later : parts[j].exprs)
            read_later =
                read_later || std::find(later->inputs().begin(), later->inputs().end(), v) != later->inputs().end();
        if (read_later) parts[i].outputs.push_back(static_cast<TensorView*>(v));
      }
  }
  return parts;
}

const Tensor& ValueMap::tensor(const Val* v) const {
  auto it = tensors.find(v);
  if (it == tensors.end()) throw std::logic_error("no value bound for " + v->name());
  return it->second;
}

double ValueMap::scalar(const Val* v) const {
  auto* s = static_cast<const Scalar*>(v);
  if (s->isConstant()) return *s->value();
  auto it = scalars.find(v);
  if (it == scalars.end()) throw std::logic_error("no value bound for " + v->name());
  return it->second;
}

}  // namespace meshfuse

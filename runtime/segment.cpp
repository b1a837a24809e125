#include "runtime/segment.h"

#include <sstream>
#include <stdexcept>

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

std::string Segment::toString() const {
  std::ostringstream os;
  os << meshfuse::toString(kind) << "(";
  for (size_t i = 0; i < inputs.size(); ++i) os << (i ? ", " : "") << inputs[i]->name();
  os << ") -> (";
  for (size_t i = 0; i < outputs.size(); ++i) os << (i ? ", " : "") << outputs[i]->name();
  os << ") {";
  for (const Expr* e : exprs) os << " " << e->out()->name() << "=" << meshfuse::toString(e->op());
  os << " }";
  return os.str();
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

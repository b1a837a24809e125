#include "ir/pointwise_probe.h"

#include <cmath>

namespace meshfuse {

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;

class Prober {
 public:
  explicit Prober(const std::unordered_map<const Val*, double>& leaves) : memo_(leaves) {}

  std::optional<double> value(const Val* v) {
    if (auto it = memo_.find(v); it != memo_.end()) return it->second;
    if (!v->isTensor()) {
      const auto* s = static_cast<const Scalar*>(v);
      return s->isConstant() ? s->value() : std::nullopt;
    }
    const Expr* def = v->definition();
    if (def == nullptr || !isFloatingPoint(v->dtype())) return std::nullopt;
    std::optional<double> a = operand(def, 0), b = def->inputs().size() > 1 ? operand(def, 1) : std::nullopt;
    if (!a) return std::nullopt;
    std::optional<double> r = apply(def, *a, b);
    if (r) memo_[v] = *r;
    return r;
  }

 private:
  std::optional<double> operand(const Expr* def, size_t i) {
    const Val* in = def->input(i);
    if (in->isTensor() && !isFloatingPoint(in->dtype())) return std::nullopt;
    return value(in);
  }

  static std::optional<double> apply(const Expr* def, double a, std::optional<double> b) {
    switch (def->op()) {
      case OpType::Set:
      case OpType::Cast: return a;
      case OpType::Neg: return -a;
      case OpType::Square: return a * a;
      case OpType::Exp: return std::exp(a);
      case OpType::Tanh: return std::tanh(a);
      case OpType::Sqrt: return std::sqrt(a);
      case OpType::Rsqrt: return 1.0 / std::sqrt(a);
      case OpType::Reciprocal: return 1.0 / a;
      default: break;
    }
    if (!b || def->inputs().size() != 2) return std::nullopt;
    switch (def->op()) {
      case OpType::Add: return a + *b;
      case OpType::Sub: return a - *b;
      case OpType::Mul: return a * *b;
      case OpType::Div: return a / *b;
      case OpType::Pow: return std::pow(a, *b);
      default: return std::nullopt;
    }
  }

  std::unordered_map<const Val*, double> memo_;
};
}  // namespace

std::optional<double> probePointwise(const Val* v, const std::unordered_map<const Val*, double>& leaves) {
  return Prober(leaves).value(v);
}

double geluTanh(double u) { return 0.5 * u * (1.0 + std::tanh(kSqrt2OverPi * (u + kGeluCubic * u * u * u))); }

double geluTanhGrad(double u) {
  const double t = std::tanh(kSqrt2OverPi * (u + kGeluCubic * u * u * u));
  return 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * u * u);
}

}  // namespace meshfuse

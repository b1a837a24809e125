// An independent float64 evaluator of a Fusion, for the fuzz tests: it walks the fusion's exprs
// with naive loops over global (unsharded) row-major tensors and knows nothing of segments,
// shardings or executors. Supports the ops the fuzzers generate: unary, binary (numpy
// broadcasting, tensor or scalar operands), cast, set, sum / reduce_max (axes, keepdim),
// broadcast_in_dim, permute, reshape, linear.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "ir/ir.h"
#include "runtime/tensor.h"

namespace meshfuse::testing {

struct RefTensor {
  std::vector<int64_t> shape;
  std::vector<double> data;  // row-major
};

inline std::vector<int64_t> refStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * shape[d + 1];
  return s;
}

// The multi-index of linear index i in `shape`.
inline std::vector<int64_t> unravel(int64_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}

inline RefTensor refFromTensor(const Tensor& t) {
  RefTensor r{t.shape(), std::vector<double>(static_cast<size_t>(t.numel()))};
  for (int64_t i = 0; i < t.numel(); ++i) r.data[i] = t.item(i);
  return r;
}

inline double applyUnary(OpType op, double x) {
  switch (op) {
    case OpType::Neg: return -x;
    case OpType::Abs: return std::fabs(x);
    case OpType::Relu: return x > 0 ? x : 0;
    case OpType::Sigmoid: return 1 / (1 + std::exp(-x));
    case OpType::Tanh: return std::tanh(x);
    case OpType::Exp: return std::exp(x);
    case OpType::Rsqrt: return 1 / std::sqrt(x);
    case OpType::Reciprocal: return 1 / x;
    case OpType::Erf: return std::erf(x);
    case OpType::Silu: return x / (1 + std::exp(-x));
    case OpType::Square: return x * x;
    case OpType::LogicalNot: return x == 0;
    default: throw std::logic_error("reference: unary " + toString(op) + " not modelled");
  }
}

inline double applyBinary(OpType op, double a, double b) {
  switch (op) {
    case OpType::Add: return a + b;
    case OpType::Sub: return a - b;
    case OpType::Mul: return a * b;
    case OpType::Max: return std::max(a, b);
    case OpType::Min: return std::min(a, b);
    case OpType::Div: return a / b;
    case OpType::Lt: return a < b;
    case OpType::Le: return a <= b;
    case OpType::Gt: return a > b;
    case OpType::Ge: return a >= b;
    case OpType::Eq: return a == b;
    case OpType::Ne: return a != b;
    case OpType::LogicalAnd: return a != 0 && b != 0;
    case OpType::LogicalOr: return a != 0 || b != 0;
    default: throw std::logic_error("reference: binary " + toString(op) + " not modelled");
  }
}

// Reads `t` at the multi-index `out_idx` of a broadcast result of rank out_rank (right-aligned).
inline double broadcastRead(const RefTensor& t, const std::vector<int64_t>& out_idx) {
  const size_t offset = out_idx.size() - t.shape.size();
  int64_t at = 0;
  for (size_t d = 0; d < t.shape.size(); ++d) at = at * t.shape[d] + (t.shape[d] == 1 ? 0 : out_idx[offset + d]);
  return t.data[static_cast<size_t>(at)];
}

inline double roundTo(DataType dtype, double v) {
  if (dtype == DataType::Float) return static_cast<double>(static_cast<float>(v));
  if (dtype == DataType::Bool) return v != 0;
  if (dtype == DataType::Int || dtype == DataType::Int32) return std::trunc(v);
  return v;  // 16-bit floats: the comparison's tolerance covers them
}

class ReferenceEvaluator {
 public:
  // `inputs[i]` binds fusion.inputs()[i] (a RefTensor for tensors; shape {} with one value for scalars).
  std::vector<RefTensor> run(const Fusion& fusion, const std::vector<RefTensor>& inputs) {
    for (size_t i = 0; i < inputs.size(); ++i) values_[fusion.inputs()[i]] = inputs[i];
    for (const auto& e : fusion.exprs()) values_[e->out()] = eval(*e);
    std::vector<RefTensor> outs;
    for (const Val* v : fusion.outputs()) outs.push_back(values_.at(v));
    return outs;
  }

 private:
  const RefTensor& operand(const Val* v) {
    auto it = values_.find(v);
    if (it != values_.end()) return it->second;
    auto* s = static_cast<const Scalar*>(v);
    if (v->isTensor() || !s->isConstant()) throw std::logic_error("reference: unbound " + v->name());
    return values_[v] = RefTensor{{}, {*s->value()}};
  }

  RefTensor eval(const Expr& e) {
    const OpType op = e.op();
    const DataType dt = e.out()->dtype();
    if (isUnary(op) || op == OpType::Cast || op == OpType::Set) {
      RefTensor r = operand(e.input(0));
      for (double& x : r.data) x = roundTo(dt, isUnary(op) ? applyUnary(op, x) : x);
      return r;
    }
    if (isBinary(op) || op == OpType::Where) {
      std::vector<const RefTensor*> in;
      for (const Val* v : e.inputs()) in.push_back(&operand(v));
      size_t rank = 0;
      for (const RefTensor* t : in) rank = std::max(rank, t->shape.size());
      std::vector<int64_t> shape(rank, 1);
      for (const RefTensor* t : in)
        for (size_t d = 0; d < t->shape.size(); ++d) {
          int64_t& s = shape[shape.size() - t->shape.size() + d];
          s = std::max(s, t->shape[d]);
        }
      RefTensor r{shape, std::vector<double>(static_cast<size_t>(numelOf(shape)))};
      for (int64_t i = 0; i < numelOf(shape); ++i) {
        auto idx = unravel(i, shape);
        const double a = broadcastRead(*in[0], idx), b = broadcastRead(*in[1], idx);
        // where's operands are rounded to the result's dtype like a binary op's result.
        r.data[i] =
            roundTo(dt, op == OpType::Where ? (a != 0 ? b : broadcastRead(*in[2], idx)) : applyBinary(op, a, b));
      }
      return r;
    }
    const RefTensor& x = operand(e.input(0));
    const auto& attrs = e.attrs();
    switch (op) {
      case OpType::Sum:
      case OpType::Mean:
      case OpType::ReduceMax: {
        const int64_t rank = static_cast<int64_t>(x.shape.size());
        std::vector<bool> reduced(x.shape.size(), false);
        for (int64_t a : attrs.axes) reduced[static_cast<size_t>(a < 0 ? a + rank : a)] = true;
        std::vector<int64_t> kept_shape;  // the output shape with keepdim (1 on reduced axes)
        for (int64_t d = 0; d < rank; ++d) kept_shape.push_back(reduced[d] ? 1 : x.shape[d]);
        const int64_t n = numelOf(kept_shape);
        RefTensor r{{}, std::vector<double>(static_cast<size_t>(n), op == OpType::ReduceMax ? -INFINITY : 0.0)};
        const auto out_strides = refStrides(kept_shape);
        for (int64_t i = 0; i < numelOf(x.shape); ++i) {
          auto idx = unravel(i, x.shape);
          int64_t at = 0;
          for (int64_t d = 0; d < rank; ++d) at += (reduced[d] ? 0 : idx[d]) * out_strides[d];
          double& acc = r.data[static_cast<size_t>(at)];
          acc = op == OpType::ReduceMax ? std::max(acc, x.data[i]) : acc + x.data[i];
        }
        for (int64_t d = 0; d < rank; ++d)
          if (!reduced[d] || attrs.keepdim) r.shape.push_back(kept_shape[d]);
        const double count = static_cast<double>(numelOf(x.shape)) / static_cast<double>(std::max<int64_t>(n, 1));
        for (double& v : r.data) v = roundTo(dt, op == OpType::Mean ? v / count : v);
        return r;
      }
      case OpType::Slice: {  // attrs: axes = starts, shape = ends, strides = steps
        std::vector<int64_t> shape;
        for (size_t d = 0; d < x.shape.size(); ++d)
          shape.push_back((attrs.shape[d] - attrs.axes[d] + attrs.strides[d] - 1) / attrs.strides[d]);
        RefTensor r{shape, std::vector<double>(static_cast<size_t>(numelOf(shape)))};
        const auto in_strides = refStrides(x.shape);
        for (int64_t i = 0; i < numelOf(shape); ++i) {
          auto idx = unravel(i, shape);
          int64_t at = 0;
          for (size_t d = 0; d < idx.size(); ++d) at += (attrs.axes[d] + idx[d] * attrs.strides[d]) * in_strides[d];
          r.data[i] = x.data[static_cast<size_t>(at)];
        }
        return r;
      }
      case OpType::Cat: {
        const size_t dim = static_cast<size_t>(attrs.axes[0]);
        std::vector<int64_t> shape = x.shape;
        shape[dim] = 0;
        for (const Val* v : e.inputs()) shape[dim] += operand(v).shape[dim];
        RefTensor r{shape, std::vector<double>(static_cast<size_t>(numelOf(shape)))};
        const auto out_strides = refStrides(shape);
        int64_t base = 0;  // where the current input starts along dim
        for (const Val* v : e.inputs()) {
          const RefTensor& t = operand(v);
          for (int64_t i = 0; i < numelOf(t.shape); ++i) {
            auto idx = unravel(i, t.shape);
            idx[dim] += base;
            int64_t at = 0;
            for (size_t d = 0; d < idx.size(); ++d) at += idx[d] * out_strides[d];
            r.data[static_cast<size_t>(at)] = t.data[static_cast<size_t>(i)];
          }
          base += t.shape[dim];
        }
        return r;
      }
      case OpType::BroadcastInDim: {
        // Input axis i maps to output axis axes[i]; other output axes are new (broadcast).
        const std::vector<int64_t>& out_shape = attrs.shape;  // the fuzzers give every target extent
        RefTensor r{out_shape, std::vector<double>(static_cast<size_t>(numelOf(out_shape)))};
        const auto in_strides = refStrides(x.shape);
        for (int64_t i = 0; i < numelOf(out_shape); ++i) {
          auto idx = unravel(i, out_shape);
          int64_t at = 0;
          for (size_t a = 0; a < attrs.axes.size(); ++a)
            at += (x.shape[a] == 1 ? 0 : idx[static_cast<size_t>(attrs.axes[a])]) * in_strides[a];
          r.data[i] = x.data[static_cast<size_t>(at)];
        }
        return r;
      }
      case OpType::Permute: {
        std::vector<int64_t> shape;
        for (int64_t d : attrs.axes) shape.push_back(x.shape[static_cast<size_t>(d)]);
        RefTensor r{shape, std::vector<double>(x.data.size())};
        const auto in_strides = refStrides(x.shape);
        for (int64_t i = 0; i < numelOf(shape); ++i) {
          auto idx = unravel(i, shape);
          int64_t at = 0;
          for (size_t d = 0; d < idx.size(); ++d) at += idx[d] * in_strides[static_cast<size_t>(attrs.axes[d])];
          r.data[i] = x.data[static_cast<size_t>(at)];
        }
        return r;
      }
      case OpType::Reshape: {  // e.out()->shape() may be symbolic; infer the -1 from the data
        std::vector<int64_t> shape = attrs.shape;
        int64_t known = 1;
        for (int64_t s : shape) known *= s >= 0 ? s : 1;
        for (int64_t& s : shape)
          if (s < 0) s = static_cast<int64_t>(x.data.size()) / known;
        return RefTensor{shape, x.data};
      }
      case OpType::Linear: {  // x [M, K] @ w[N, K]^T
        const RefTensor& w = operand(e.input(1));
        const int64_t m = x.shape[0], k = x.shape[1], n = w.shape[0];
        RefTensor r{{m, n}, std::vector<double>(static_cast<size_t>(m * n), 0.0)};
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double acc = 0;
            for (int64_t q = 0; q < k; ++q) acc += x.data[i * k + q] * w.data[j * k + q];
            r.data[i * n + j] = roundTo(dt, acc);
          }
        return r;
      }
      default: throw std::logic_error("reference: op " + toString(op) + " not modelled");
    }
  }

  std::unordered_map<const Val*, RefTensor> values_;
};

// The relative tolerance for a fusion: its least precise floating dtype decides.
inline double toleranceFor(const Fusion& fusion) {
  double tol = 1e-9;
  for (const auto& v : fusion.vals()) {
    if (!v->isTensor()) continue;
    DataType d = v->dtype();
    if (d == DataType::BFloat16) tol = std::max(tol, 8e-2);
    if (d == DataType::Half) tol = std::max(tol, 2e-2);
    if (d == DataType::Float) tol = std::max(tol, 2e-5);
  }
  return tol;
}

// "" when `actual` (logical order) matches `expected` within tol * (1 + |expected|), else why not.
inline std::string compareToReference(const Tensor& actual, const RefTensor& expected, double tol) {
  if (!actual.defined()) return "no result";
  if (actual.shape() != expected.shape)
    return "shape " + shapeToString(actual.shape()) + ", expected " + shapeToString(expected.shape);
  for (int64_t i = 0; i < actual.numel(); ++i) {
    double a = actual.item(i), e = expected.data[static_cast<size_t>(i)];
    if (!(std::fabs(a - e) <= tol * (1 + std::fabs(e))))
      return "element " + std::to_string(i) + " is " + std::to_string(a) + ", expected " + std::to_string(e);
  }
  return "";
}

}  // namespace meshfuse::testing

#include "test_cpu_reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "runtime/element.h"

namespace meshfuse::testing {

namespace {

std::vector<int64_t> unravel(int64_t linear, const std::vector<int64_t>& shape) {
  std::vector<int64_t> index(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    index[d] = linear % shape[d];
    linear /= shape[d];
  }
  return index;
}

int64_t ravel(const std::vector<int64_t>& index, const std::vector<int64_t>& shape) {
  int64_t linear = 0;
  for (size_t d = 0; d < shape.size(); ++d) linear = linear * shape[d] + index[d];
  return linear;
}

// t's element at `out_index` of a (numpy-broadcast) result of rank out_index.size().
double broadcastAt(const RefTensor& t, const std::vector<int64_t>& out_index) {
  const size_t offset = out_index.size() - t.shape.size();
  int64_t linear = 0;
  for (size_t d = 0; d < t.shape.size(); ++d)
    linear = linear * t.shape[d] + (t.shape[d] == 1 ? 0 : out_index[offset + d]);
  return t.data[linear];
}

double roundTo(DataType dtype, double v) {
  alignas(8) unsigned char buf[8];
  storeFromDouble(buf, dtype, v);
  return loadAsDouble(buf, dtype);
}

double unaryRef(OpType op, double x) {
  switch (op) {
    case OpType::Neg: return -x;
    case OpType::Abs: return std::fabs(x);
    case OpType::Exp: return std::exp(x);
    case OpType::Log: return std::log(x);
    case OpType::Sqrt: return std::sqrt(x);
    case OpType::Rsqrt: return 1.0 / std::sqrt(x);
    case OpType::Reciprocal: return 1.0 / x;
    case OpType::Square: return x * x;
    case OpType::Relu: return x > 0 ? x : (std::isnan(x) ? x : 0.0);
    case OpType::Sigmoid: return 1.0 / (1.0 + std::exp(-x));
    case OpType::Tanh: return std::tanh(x);
    case OpType::Gelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case OpType::Set: return x;
    default: throw std::logic_error("unaryRef: " + toString(op));
  }
}

double binaryRef(OpType op, double a, double b) {
  switch (op) {
    case OpType::Add: return a + b;
    case OpType::Sub: return a - b;
    case OpType::Mul: return a * b;
    case OpType::Div: return a / b;
    case OpType::Max: return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case OpType::Min: return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
    case OpType::Pow: return std::pow(a, b);
    default: throw std::logic_error("binaryRef: " + toString(op));
  }
}

RefTensor pointwiseRef(const Expr& e, const std::vector<RefTensor>& in, const ValueMap& values) {
  std::vector<int64_t> shape;
  for (const RefTensor& t : in) shape.resize(std::max(shape.size(), t.shape.size()), 1);
  for (const RefTensor& t : in)
    for (size_t d = 0; d < t.shape.size(); ++d) {
      int64_t& s = shape[shape.size() - t.shape.size() + d];
      if (s == 1) s = t.shape[d];
    }
  RefTensor out{shape, std::vector<double>(static_cast<size_t>(numelOf(shape)))};
  const DataType out_dtype = e.out()->dtype();
  for (int64_t i = 0; i < numelOf(shape); ++i) {
    std::vector<int64_t> idx = unravel(i, shape);
    std::vector<double> args;
    size_t t = 0;
    for (const Val* v : e.inputs()) args.push_back(v->isTensor() ? broadcastAt(in[t++], idx) : values.scalar(v));
    double r;
    if (e.op() == OpType::Cast)
      r = roundTo(e.attrs().cast_to, args[0]);
    else if (isBinary(e.op()))
      r = binaryRef(e.op(), args[0], args[1]);
    else
      r = unaryRef(e.op(), args[0]);
    if (e.op() == OpType::Pow && !isFloatingPoint(out_dtype)) r = roundTo(out_dtype, r);
    out.data[i] = r;
  }
  return out;
}

RefTensor reductionRef(const Expr& e, const RefTensor& x) {
  const auto& axes = e.attrs().axes;
  std::vector<int64_t> out_shape, kept_shape;
  int64_t count = 1;
  for (int64_t d = 0; d < static_cast<int64_t>(x.shape.size()); ++d) {
    bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (reduced)
      count *= x.shape[d];
    else
      kept_shape.push_back(x.shape[d]);
    if (!reduced)
      out_shape.push_back(x.shape[d]);
    else if (e.attrs().keepdim)
      out_shape.push_back(1);
  }
  const bool is_max = e.op() == OpType::ReduceMax;
  RefTensor out{out_shape, std::vector<double>(static_cast<size_t>(numelOf(out_shape)), is_max ? -INFINITY : 0.0)};
  for (int64_t i = 0; i < numelOf(x.shape); ++i) {
    std::vector<int64_t> idx = unravel(i, x.shape), kept;
    for (int64_t d = 0; d < static_cast<int64_t>(idx.size()); ++d)
      if (std::find(axes.begin(), axes.end(), d) == axes.end()) kept.push_back(idx[d]);
    double& acc = out.data[ravel(kept, kept_shape)];
    const double v = x.data[i];
    if (!is_max)
      acc += v;
    else if (std::isnan(v) || v > acc)
      acc = std::isnan(acc) ? acc : v;
  }
  if (e.op() == OpType::Mean)
    for (double& v : out.data) v /= static_cast<double>(count);
  return out;
}

// C[batch..., M, N] = A[batch..., M, K] @ B[batch..., K, N] with batch broadcasting (ranks >= 2).
RefTensor batchedMatmulRef(const RefTensor& a, const RefTensor& b) {
  const size_t ra = a.shape.size(), rb = b.shape.size();
  const int64_t m = a.shape[ra - 2], k = a.shape[ra - 1], n = b.shape[rb - 1];
  RefTensor ba{{a.shape.begin(), a.shape.end() - 2}, {}}, bb{{b.shape.begin(), b.shape.end() - 2}, {}};
  std::vector<int64_t> batch(std::max(ba.shape.size(), bb.shape.size()), 1);
  for (const auto* s : {&ba.shape, &bb.shape})
    for (size_t d = 0; d < s->size(); ++d) {
      int64_t& o = batch[batch.size() - s->size() + d];
      if (o == 1) o = (*s)[d];
    }
  std::vector<int64_t> shape = batch;
  shape.push_back(m);
  shape.push_back(n);
  RefTensor out{shape, std::vector<double>(static_cast<size_t>(numelOf(shape)), 0.0)};
  for (int64_t bi = 0; bi < numelOf(batch); ++bi) {
    std::vector<int64_t> idx = unravel(bi, batch);
    auto batchBase = [&](const std::vector<int64_t>& bs) {
      int64_t lin = 0;
      for (size_t d = 0; d < bs.size(); ++d) lin = lin * bs[d] + (bs[d] == 1 ? 0 : idx[idx.size() - bs.size() + d]);
      return lin;
    };
    const double* pa = a.data.data() + batchBase(ba.shape) * m * k;
    const double* pb = b.data.data() + batchBase(bb.shape) * k * n;
    double* pc = out.data.data() + bi * m * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += pa[i * k + p] * pb[p * n + j];
        pc[i * n + j] = s;
      }
  }
  return out;
}

RefTensor transpose2d(const RefTensor& w) {
  const int64_t r = w.shape[0], c = w.shape[1];
  RefTensor t{{c, r}, std::vector<double>(w.data.size())};
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) t.data[j * r + i] = w.data[i * c + j];
  return t;
}

RefTensor matmulRef(const Expr& e, const std::vector<RefTensor>& in) {
  RefTensor a = in[0], b = in[1];
  std::vector<int64_t> out_shape;
  if (e.op() == OpType::Linear) {
    const int64_t k = a.shape.back();
    out_shape.assign(a.shape.begin(), a.shape.end() - 1);
    a.shape = {numelOf(out_shape), k};
    if (b.shape.size() == 2) {
      out_shape.push_back(b.shape[0]);
      b = transpose2d(b);
    } else {
      b.shape = {k, 1};
    }
  } else {
    const bool a_vec = a.shape.size() == 1, b_vec = b.shape.size() == 1;
    if (a_vec) a.shape.insert(a.shape.begin(), 1);
    if (b_vec) b.shape.push_back(1);
  }
  RefTensor c = batchedMatmulRef(a, b);
  if (e.op() == OpType::Linear && in.size() > 2) {
    const RefTensor& bias = in[2];
    const int64_t n = c.shape.back();
    for (int64_t i = 0; i < static_cast<int64_t>(c.data.size()); ++i)
      c.data[i] += bias.data[bias.data.size() == 1 ? 0 : i % n];
  }
  if (e.op() == OpType::Matmul) {
    out_shape = c.shape;
    if (in[1].shape.size() == 1) out_shape.pop_back();
    if (in[0].shape.size() == 1) out_shape.erase(out_shape.end() - (in[1].shape.size() == 1 ? 1 : 2));
  }
  c.shape = out_shape;
  return c;
}

RefTensor viewRef(const Expr& e, const RefTensor& x, const std::vector<int64_t>& out_shape) {
  RefTensor out{out_shape, std::vector<double>(static_cast<size_t>(numelOf(out_shape)))};
  for (int64_t i = 0; i < numelOf(out_shape); ++i) {
    std::vector<int64_t> idx = unravel(i, out_shape), src(x.shape.size());
    switch (e.op()) {
      case OpType::Permute:
        for (size_t d = 0; d < idx.size(); ++d) src[e.attrs().axes[d]] = idx[d];
        break;
      case OpType::BroadcastInDim:
        for (size_t d = 0; d < x.shape.size(); ++d) src[d] = x.shape[d] == 1 ? 0 : idx[e.attrs().axes[d]];
        break;
      case OpType::Reshape: src = unravel(i, x.shape); break;
      default: throw std::logic_error("viewRef: " + toString(e.op()));
    }
    out.data[i] = x.data[ravel(src, x.shape)];
  }
  return out;
}

}  // namespace

RefTensor toRef(const Tensor& t) {
  RefTensor r{t.shape(), std::vector<double>(static_cast<size_t>(t.numel()))};
  for (int64_t i = 0; i < t.numel(); ++i) r.data[i] = t.item(i);
  return r;
}

std::unordered_map<const Val*, RefTensor> referenceEvaluate(const Fusion& fusion, const ValueMap& inputs) {
  std::unordered_map<const Val*, RefTensor> ref;
  for (const auto& [v, t] : inputs.tensors) ref[v] = toRef(t);
  for (const Expr* e : fusion.liveExprs()) {
    std::vector<RefTensor> in;
    for (const Val* v : e->inputs())
      if (v->isTensor()) in.push_back(ref.at(v));
    RefTensor out;
    if (isPointwise(e->op()))
      out = pointwiseRef(*e, in, inputs);
    else if (isReduction(e->op()))
      out = reductionRef(*e, in[0]);
    else if (e->op() == OpType::Matmul || e->op() == OpType::Linear)
      out = matmulRef(*e, in);
    else
      out = viewRef(*e, in[0], e->out()->shape());
    ref[e->out()] = std::move(out);
  }
  return ref;
}

Tensor randomTensor(const std::vector<int64_t>& shape, DataType dtype, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Tensor t = Tensor::empty(shape, dtype);
  char* p = static_cast<char*>(t.data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = dist(rng);
    if (isIntegral(dtype)) v = std::round(v);
    if (dtype == DataType::Bool) v = v > (lo + hi) / 2 ? 1.0 : 0.0;
    storeFromDouble(p + i * t.itemsize(), dtype, v);
  }
  return t;
}

Segment wholeFusionSegment(const Fusion& fusion, Segment::Kind kind) {
  Segment seg;
  seg.kind = kind;
  for (const Expr* e : fusion.liveExprs()) seg.exprs.push_back(e);
  seg.inputs = fusion.inputs();
  for (Val* v : fusion.outputs()) seg.outputs.push_back(static_cast<TensorView*>(v));
  return seg;
}

ShapeMap definedShapes(const Fusion& fusion) {
  ShapeMap shapes;
  for (const auto& v : fusion.vals())
    if (v->isTensor()) shapes[v.get()] = static_cast<const TensorView*>(v.get())->shape();
  return shapes;
}

void runOnCpu(const Fusion& fusion, Segment::Kind kind, ValueMap& values) {
  makeCpuExecutor()->run(wholeFusionSegment(fusion, kind), values, definedShapes(fusion));
}

double toleranceFor(DataType dtype) {
  switch (dtype) {
    case DataType::Float: return 1e-5;
    case DataType::Double: return 1e-12;
    case DataType::Half: return 4e-3;
    case DataType::BFloat16: return 3e-2;
    default: return 0.0;
  }
}

void expectMatches(const Tensor& actual, const RefTensor& expected, const std::string& what, double scale) {
  ASSERT_EQ(actual.shape(), expected.shape) << what;
  const double tol = toleranceFor(actual.dtype()) * scale;
  int64_t bad = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    const double a = actual.item(i), e = expected.data[i];
    const bool ok = (std::isnan(a) && std::isnan(e)) || a == e || std::fabs(a - e) <= tol * (1.0 + std::fabs(e));
    if (!ok && bad++ < 5) first << "  [" << i << "] got " << a << " expected " << e << "\n";
  }
  EXPECT_EQ(bad, 0) << what << " (" << actual.toString() << "): " << bad << " of " << actual.numel()
                    << " elements differ beyond tolerance " << tol << "\n"
                    << first.str();
}

void checkAgainstReference(const Fusion& fusion, Segment::Kind kind, ValueMap& values, const std::string& what,
                           double scale) {
  auto ref = referenceEvaluate(fusion, values);
  runOnCpu(fusion, kind, values);
  for (Val* out : fusion.outputs()) expectMatches(values.tensor(out), ref.at(out), what + " " + out->name(), scale);
}

}  // namespace meshfuse::testing

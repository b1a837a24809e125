// The CUDA segment executor against the CPU executor, op by op, on random data: every pointwise op
// and dtype (contiguous/vectorized and strided/broadcast paths), casts, fused chains, reductions,
// matmul/linear through cuBLASLt and views. Skipped (with the CUDA runtime's reason) without a GPU.
#include <gtest/gtest.h>

#if MESHFUSE_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <tuple>

#include "gelu_fusions.h"
#include "host_ir/matmul_epilogue.h"
#include "norm_fusions.h"
#include "ops/ops.h"
#include "runtime/cuda/allocator.h"
#include "runtime/cuda/kernel_cache.h"
#include "runtime/cuda/matmul.h"
#include "runtime/cuda/streams.h"
#include "runtime/element.h"
#include "runtime/segment.h"
#include "runtime/view_ops.h"
#include "scoped_env.h"

namespace meshfuse {
namespace {

#define SKIP_WITHOUT_GPU()                                                         \
  do {                                                                             \
    std::string why_;                                                              \
    if (cuda::deviceCount(&why_) == 0) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)

const std::vector<DataType> kFloatTypes = {DataType::Float, DataType::Double, DataType::Half, DataType::BFloat16};
const std::vector<DataType> kAllTypes = {DataType::Float, DataType::Double, DataType::Half, DataType::BFloat16,
                                         DataType::Int,   DataType::Int32,  DataType::Bool};

Tensor randomTensor(const std::vector<int64_t>& shape, DataType dtype, std::mt19937& rng, double lo, double hi) {
  Tensor t = Tensor::empty(shape, dtype);
  std::uniform_real_distribution<double> real(lo, hi);
  std::uniform_int_distribution<int> integer(static_cast<int>(std::ceil(lo)), static_cast<int>(std::floor(hi)));
  char* p = static_cast<char*>(t.data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = dtype == DataType::Bool ? (rng() & 1) : isFloatingPoint(dtype) ? real(rng) : integer(rng);
    storeFromDouble(p + i * static_cast<int64_t>(t.itemsize()), dtype, v);
  }
  return t;
}

// Tolerance of a result of `dtype` (`loose` for TF32 matmuls and long fp16 accumulations).
double tolerance(DataType dtype, bool loose) {
  switch (dtype) {
    case DataType::Float: return loose ? 2e-2 : 2e-5;
    case DataType::Double: return 1e-10;
    case DataType::Half: return loose ? 3e-2 : 4e-3;
    case DataType::BFloat16: return loose ? 6e-2 : 2e-2;
    default: return 0;
  }
}

void expectClose(const Tensor& expected, const Tensor& actual_device, const std::string& what, bool loose = false) {
  ASSERT_EQ(actual_device.device(), Device::cuda(0)) << what;
  Tensor actual = actual_device.to(Device::cpu());
  ASSERT_EQ(expected.shape(), actual.shape()) << what;
  ASSERT_EQ(expected.dtype(), actual.dtype()) << what;
  const double tol = tolerance(expected.dtype(), loose);
  int64_t bad = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    double e = expected.item(i), a = actual.item(i);
    bool ok = (std::isnan(e) && std::isnan(a)) || e == a || std::abs(e - a) <= tol * (1 + std::abs(e));
    if (!ok && bad++ < 3)
      ADD_FAILURE() << what << ": element " << i << " expected " << e << " got " << a << " (" << expected.toString()
                    << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << expected.numel() << " elements differ";
}

// One segment run on both executors from the same random inputs.
struct Case {
  Fusion fusion;
  Segment::Kind kind = Segment::Kind::Pointwise;
  std::vector<std::pair<Val*, Tensor>> inputs;  // CPU tensors (the CUDA run gets copies, optionally restrided)
  std::vector<std::pair<Val*, double>> scalars;
  std::vector<TensorView*> outputs;
  std::function<Tensor(const Tensor&)> to_device = [](const Tensor& t) { return t.to(Device::cuda(0)); };
  // A Matmul segment as the lowering builds one with an epilogue: the matmul, then the exprs that
  // findMatmulEpilogues folds into it.
  bool fold_epilogue = false;
  // After check(): the CUDA executor's outputs, copied to the host (for tests that compare two runs).
  std::vector<Tensor> gpu_results;
  // The CUDA executor, made on the first check() and kept: a Case checked again (after redraw())
  // runs its segment on the same executor, as a cached program's segments run.
  std::unique_ptr<SegmentExecutor> gpu;
  std::vector<std::pair<double, double>> ranges;  // each input's [lo, hi)

  TensorView* input(DataType dtype, const std::vector<int64_t>& shape, std::mt19937& rng, double lo = -3,
                    double hi = 3) {
    TensorView* tv = fusion.newTensor(dtype, shape);
    fusion.addInput(tv);
    inputs.push_back({tv, randomTensor(shape, dtype, rng, lo, hi)});
    ranges.emplace_back(lo, hi);
    return tv;
  }

  // New random values for every input, each in its range.
  void redraw(std::mt19937& rng) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      Tensor& t = inputs[i].second;
      t = randomTensor(t.shape(), t.dtype(), rng, ranges[i].first, ranges[i].second);
    }
  }

  void check(const std::string& what, bool loose = false) {
    Segment seg;
    seg.kind = kind;
    for (const auto& e : fusion.exprs()) seg.exprs.push_back(e.get());
    if (fold_epilogue) {
      auto folds = findMatmulEpilogues(fusion, [](const Expr*) { return true; });
      ASSERT_EQ(folds.size(), 1u) << what;
      seg.exprs = {folds.begin()->first};
      seg.exprs.insert(seg.exprs.end(), folds.begin()->second.exprs.begin(), folds.begin()->second.exprs.end());
      seg.epilogue = folds.begin()->second.epilogue;
    }
    for (const auto& [v, t] : inputs) seg.inputs.push_back(v);
    for (const auto& [v, s] : scalars) seg.inputs.push_back(v);
    seg.outputs = outputs;
    ShapeMap shapes;
    for (const auto& v : fusion.vals())
      if (v->isTensor()) shapes[v.get()] = static_cast<TensorView*>(v.get())->shape();
    ValueMap cpu_values, gpu_values;
    for (const auto& [v, t] : inputs) {
      cpu_values.tensors[v] = t;
      gpu_values.tensors[v] = to_device(t);
    }
    for (const auto& [v, s] : scalars) cpu_values.scalars[v] = gpu_values.scalars[v] = s;
    makeCpuExecutor()->run(seg, cpu_values, shapes);
    if (!gpu) gpu = makeCudaExecutor(0);
    ASSERT_NO_THROW(gpu->run(seg, gpu_values, shapes)) << what;
    for (TensorView* out : outputs) {
      expectClose(cpu_values.tensor(out), gpu_values.tensor(out), what + " " + out->name(), loose);
      gpu_results.push_back(gpu_values.tensor(out).to(Device::cpu()));
    }
  }
};

bool positiveDomain(OpType op) { return op == OpType::Log || op == OpType::Sqrt; }

TEST(CudaExecutorPointwise, EveryUnaryOpOnEveryDtype) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  const OpType ops_list[] = {OpType::Neg,  OpType::Abs,     OpType::Exp,  OpType::Log, OpType::Sqrt,
                             OpType::Relu, OpType::Sigmoid, OpType::Tanh, OpType::Gelu};
  for (DataType dt : kAllTypes) {
    if (dt == DataType::Bool) continue;
    for (OpType op : ops_list) {
      Case c;
      TensorView* x = c.input(dt, {37, 129}, rng, positiveDomain(op) ? 0.1 : -3, 3);
      c.outputs = {ops::unary(op, x)};
      c.check(toString(op) + " on " + toString(dt));
    }
  }
}

TEST(CudaExecutorPointwise, EveryBinaryOpOnEveryDtypeWithBroadcasting) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(2);
  const OpType ops_list[] = {OpType::Add, OpType::Sub, OpType::Mul, OpType::Div, OpType::Max, OpType::Min, OpType::Pow};
  for (DataType dt : kAllTypes) {
    for (OpType op : ops_list) {
      const bool pow = op == OpType::Pow;
      // Same shapes (vectorized path) and a [37,1] x [1,129] broadcast (strided path).
      for (bool broadcast : {false, true}) {
        Case c;
        TensorView* a = c.input(dt, broadcast ? std::vector<int64_t>{37, 1} : std::vector<int64_t>{37, 129}, rng,
                                pow ? 0.5 : -4, pow ? 2 : 4);
        TensorView* b = c.input(dt, {broadcast ? 1 : 37, 129}, rng, pow ? 0 : 1, 3);  // nonzero divisors
        c.outputs = {ops::binary(op, a, b)};
        c.check(toString(op) + " on " + toString(dt) + (broadcast ? " broadcast" : ""));
      }
    }
  }
}

TEST(CudaExecutorPointwise, NewUnaryOpsOnEveryDtype) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(21);
  const OpType ops_list[] = {OpType::Rsqrt, OpType::Reciprocal, OpType::Erf,
                             OpType::Silu,  OpType::Square,     OpType::LogicalNot};
  for (DataType dt : kAllTypes) {
    for (OpType op : ops_list) {
      if (dt == DataType::Bool && op != OpType::LogicalNot && op != OpType::Square) continue;
      const bool positive = op == OpType::Rsqrt || op == OpType::Reciprocal;  // no division by zero
      Case c;
      TensorView* x = c.input(dt, {37, 129}, rng, positive ? 1 : -3, 3);
      c.outputs = {ops::unary(op, x)};
      c.check(toString(op) + " on " + toString(dt));
    }
  }
}

TEST(CudaExecutorPointwise, ComparisonsLogicalOpsAndWhereWithBroadcasting) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(22);
  const OpType cmp[] = {OpType::Lt, OpType::Le, OpType::Gt, OpType::Ge, OpType::Eq, OpType::Ne};
  for (DataType dt : kAllTypes) {
    for (bool broadcast : {false, true}) {
      Case c;
      // Small integers, so that equal pairs occur in every dtype.
      TensorView* a = c.input(dt, {37, broadcast ? 1 : 129}, rng, -2, 2);
      TensorView* b = c.input(dt, {broadcast ? 1 : 37, 129}, rng, -2, 2);
      for (OpType op : cmp) c.outputs.push_back(ops::binary(op, a, b));
      TensorView* lt = c.outputs[0];
      TensorView* ne = c.outputs[5];
      c.outputs.push_back(ops::binary(OpType::LogicalAnd, lt, ne));
      c.outputs.push_back(ops::binary(OpType::LogicalOr, lt, ops::unary(OpType::LogicalNot, ne)));
      c.outputs.push_back(ops::where(lt, a, b));
      c.outputs.push_back(ops::where(ne, a, c.fusion.newScalar(DataType::Double, 0.5)));
      // A number against a tensor: float tensors compare in their own precision.
      c.outputs.push_back(ops::binary(OpType::Le, a, c.fusion.newScalar(DataType::Double, 0.1)));
      c.check("comparisons on " + toString(dt) + (broadcast ? " broadcast" : ""));
    }
  }
}

TEST(CudaExecutorPointwise, FullOnEveryDtypeFusedWithAnInput) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(23);
  for (DataType dt : kAllTypes) {
    Case c;
    TensorView* x = c.input(dt, {5, 33}, rng, -3, 3);
    TensorView* f = ops::full({5, 33}, c.fusion.newScalar(DataType::Double, dt == DataType::Bool ? 1 : 0.1), dt);
    c.outputs = {f, ops::binary(OpType::Add, x, f)};
    c.check("full on " + toString(dt));
  }
}

// uniform on CUDA equals the CPU's bit for bit (same seed and offset); normal to float rounding.
// Modes: 0 the whole [4, 1001] tensor (odd rows: counters straddle them); 1 rows [3, 8) of a global
// [8, 1001] tensor (a sharded output starting and ending mid-counter); 2 columns [501, 518) of it
// (the strided index path, runs of 17); 3 broadcast into [3, 4, 1001] (the strided path, indices
// repeating). The blocks are also checked against the whole tensor drawn on the CPU.
TEST(CudaExecutorRandom, UniformMatchesTheCpuBitForBitAlsoForAShardedBlock) {
  SKIP_WITHOUT_GPU();
  struct Mode {
    std::vector<int64_t> local, global, offsets;
  };
  const std::vector<Mode> modes = {{{4, 1001}, {4, 1001}, {0, 0}},
                                   {{5, 1001}, {8, 1001}, {3, 0}},
                                   {{8, 17}, {8, 1001}, {0, 501}},
                                   {{4, 1001}, {4, 1001}, {0, 0}}};
  for (DataType dt : {DataType::Float, DataType::Double, DataType::Half, DataType::BFloat16}) {
    for (int mode = 0; mode < 4; ++mode) {
      const Mode& m = modes[mode];
      Fusion f;
      auto num = [&](double v) { return f.newScalar(DataType::Double, v); };
      Scalar* seed = f.newScalar(DataType::Int, std::nullopt);
      f.addInput(seed);
      TensorView* u = ops::uniform(num(-2), num(3), m.global, dt, seed, f.newScalar(DataType::Int, 5));
      TensorView* nrm = ops::normal(num(1), num(2), m.global, dt, seed, f.newScalar(DataType::Int, 6));
      std::vector<TensorView*> outs = {u, nrm};
      TensorView* x = nullptr;
      if (mode == 3) {
        x = f.newTensor(dt, {3, 4, 1001});
        f.addInput(x);
        outs = {ops::binary(OpType::Mul, x, u)};  // u recomputed inside the [3, 4, 1001] kernel
      }
      Segment seg;
      for (const auto& e : f.exprs()) seg.exprs.push_back(e.get());
      seg.inputs = {seed};
      if (x) seg.inputs.push_back(x);
      seg.outputs = outs;
      ShapeMap shapes;
      for (const auto& v : f.vals())
        if (v->isTensor()) shapes[v.get()] = static_cast<TensorView*>(v.get())->shape();
      if (m.local != m.global) {
        for (TensorView* t : {u, nrm}) {
          shapes[t] = m.local;
          seg.global_blocks[t] = {m.global, m.offsets};
        }
      }
      ValueMap cpu, gpu;
      cpu.scalars[seed] = gpu.scalars[seed] = 1234567;
      if (x) {
        std::mt19937 rng(24);
        Tensor xt = randomTensor({3, 4, 1001}, dt, rng, -1, 1);
        cpu.tensors[x] = xt;
        gpu.tensors[x] = xt.to(Device::cuda(0));
      }
      makeCpuExecutor()->run(seg, cpu, shapes);
      ASSERT_NO_THROW(makeCudaExecutor(0)->run(seg, gpu, shapes));
      const std::string what = toString(dt) + " mode " + std::to_string(mode);
      const Tensor a = cpu.tensor(outs[0]), b = gpu.tensor(outs[0]).to(Device::cpu());
      int64_t differ = 0;
      for (int64_t i = 0; i < a.numel(); ++i) differ += a.item(i) != b.item(i);
      EXPECT_EQ(differ, 0) << what << ": uniform differs from the CPU's in " << differ << " elements";
      if (mode != 3) expectClose(cpu.tensor(nrm), gpu.tensor(nrm), "normal " + what, /*loose=*/false);
      if (m.local != m.global) {  // the block is that block of the whole tensor drawn on the CPU
        Fusion whole;
        Scalar* s2 = whole.newScalar(DataType::Int, 1234567.0);
        TensorView* w = ops::uniform(whole.newScalar(DataType::Double, -2), whole.newScalar(DataType::Double, 3),
                                     m.global, dt, s2, whole.newScalar(DataType::Int, 5));
        Segment ws;
        ws.exprs = {whole.exprs()[0].get()};
        ws.outputs = {w};
        ValueMap wv;
        makeCpuExecutor()->run(ws, wv, {{w, m.global}});
        const Tensor full = wv.tensor(w);
        int64_t off = 0;
        for (int64_t i = 0; i < m.local[0]; ++i)
          for (int64_t j = 0; j < m.local[1]; ++j)
            off += full.item((i + m.offsets[0]) * m.global[1] + j + m.offsets[1]) != b.item(i * m.local[1] + j);
        EXPECT_EQ(off, 0) << what << ": the block is not its block of the global tensor";
      }
    }
  }
}

TEST(CudaExecutorPointwise, MixedDtypesAndScalars) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  Case c;
  TensorView* h = c.input(DataType::Half, {1000}, rng);
  TensorView* i = c.input(DataType::Int32, {1000}, rng, -5, 5);
  Scalar* s = c.fusion.newScalar(DataType::Double, std::nullopt);  // bound at execution
  c.fusion.addInput(s);
  c.scalars.push_back({s, 0.37});
  TensorView* hs = ops::binary(OpType::Mul, h, s);                                      // Half
  TensorView* mixed = ops::binary(OpType::Add, hs, i);                                  // Half + Int32 -> Half
  TensorView* k = ops::binary(OpType::Sub, i, c.fusion.newScalar(DataType::Int, 7.0));  // Int32 constant
  TensorView* f = ops::binary(OpType::Div, i, c.fusion.newScalar(DataType::Int, 2.0));  // true division: Float
  c.outputs = {hs, mixed, k, f};
  c.check("mixed dtypes");
}

TEST(CudaExecutorPointwise, EveryCastPair) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(4);
  for (DataType from : kAllTypes) {
    Case c;
    TensorView* x = c.input(from, {3, 333}, rng, -8, 8);  // integers and small floats survive every type
    for (DataType to : kAllTypes) c.outputs.push_back(ops::cast(x, to));
    c.check("casts from " + toString(from));
  }
}

TEST(CudaExecutorPointwise, FusedChainWithIntermediateOutputsOfSeveralShapes) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  for (DataType dt : kFloatTypes) {
    Case c;
    TensorView* row = c.input(dt, {1, 300}, rng);
    TensorView* x = c.input(dt, {64, 300}, rng);
    TensorView* e = ops::unary(OpType::Tanh, row);   // [1, 300], also an output
    TensorView* y = ops::binary(OpType::Mul, x, e);  // broadcast
    TensorView* z = ops::unary(OpType::Gelu, ops::binary(OpType::Add, y, c.fusion.newScalar(DataType::Double, 0.5)));
    c.outputs = {e, z};
    c.check("chain on " + toString(dt));
  }
}

// The body of the test below, under whichever MESHFUSE_CUDA_PLAN_CACHE it sets.
void runASegmentAgainAndAtOtherShapes() {
  std::mt19937 rng(51);
  Fusion fusion;
  TensorView* row = fusion.newTensor(DataType::Float, {1, 300});
  TensorView* x = fusion.newTensor(DataType::Float, {64, 300});
  Scalar* shift = fusion.newScalar(DataType::Double, std::nullopt);
  for (Val* v : std::initializer_list<Val*>{row, x, shift}) fusion.addInput(v);
  TensorView* e = ops::unary(OpType::Tanh, row);  // [1, n]: a kernel of its own
  TensorView* z = ops::unary(OpType::Gelu, ops::binary(OpType::Add, ops::binary(OpType::Mul, x, e), shift));
  Segment seg;
  seg.kind = Segment::Kind::Pointwise;
  for (const auto& expr : fusion.exprs()) seg.exprs.push_back(expr.get());
  seg.inputs = {row, x, shift};
  seg.outputs = {e, z};
  auto gpu = makeCudaExecutor(0);
  const std::vector<std::pair<int64_t, int64_t>> runs = {{64, 300}, {64, 300}, {16, 75}, {64, 300}};
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto [rows, cols] = runs[r];
    ShapeMap shapes;
    for (const auto& v : fusion.vals()) {
      if (!v->isTensor()) continue;
      const bool one_row = static_cast<TensorView*>(v.get())->shape()[0] == 1;
      shapes[v.get()] = {one_row ? 1 : rows, cols};
    }
    ValueMap cpu_values, gpu_values;
    cpu_values.tensors[row] = randomTensor({1, cols}, DataType::Float, rng, -3, 3);
    cpu_values.tensors[x] = randomTensor({rows, cols}, DataType::Float, rng, -3, 3);
    cpu_values.scalars[shift] = gpu_values.scalars[shift] = 0.25 * static_cast<double>(r);
    for (TensorView* in : {row, x}) gpu_values.tensors[in] = cpu_values.tensors[in].to(Device::cuda(0));
    makeCpuExecutor()->run(seg, cpu_values, shapes);
    ASSERT_NO_THROW(gpu->run(seg, gpu_values, shapes)) << "run " << r;
    for (TensorView* out : seg.outputs)
      expectClose(cpu_values.tensor(out), gpu_values.tensor(out), "run " + std::to_string(r) + " " + out->name());
  }
}

// One executor runs a segment again (its pointwise kernels' plans kept from the first run), with a
// runtime scalar changed, then at other shapes (a stream loop's chunks do that: the plans are made
// again), then at the first shapes once more; every run against the CPU executor's. Then the same
// with the plans made on every run (MESHFUSE_CUDA_PLAN_CACHE=0).
TEST(CudaExecutorPointwise, ASegmentRunAgainAndAtOtherShapesMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const char* keep_plans : {"1", "0"}) {
    SCOPED_TRACE(std::string("MESHFUSE_CUDA_PLAN_CACHE=") + keep_plans);
    testing::ScopedEnv keep("MESHFUSE_CUDA_PLAN_CACHE", keep_plans);
    runASegmentAgainAndAtOtherShapes();
  }
}

TEST(CudaExecutorPointwise, StridedAndOffsetInputs) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  for (DataType dt : {DataType::Float, DataType::BFloat16, DataType::Int}) {
    Case c;
    TensorView* a = c.input(dt, {48, 70}, rng);
    TensorView* b = c.input(dt, {48, 70}, rng);
    // a arrives transposed in memory, b as a slice of a wider buffer at an odd offset.
    c.to_device = [](const Tensor& t) {
      Tensor d = t.to(Device::cuda(0));
      if (t.shape() != std::vector<int64_t>{48, 70}) return d;
      static int which = 0;
      if (which++ % 2 == 0) {
        Tensor tr = Tensor::empty({70, 48}, t.dtype(), Device::cuda(0));
        tr.permute({1, 0}).copyFrom(d);
        return tr.permute({1, 0});
      }
      Tensor wide = Tensor::empty({48, 73}, t.dtype(), Device::cuda(0));
      Tensor view = wide.slice(1, 3, 70);
      view.copyFrom(d);
      return view;
    };
    c.outputs = {ops::binary(OpType::Add, ops::unary(OpType::Abs, a), b)};
    c.check("strided inputs " + toString(dt));
  }
}

TEST(CudaExecutorReduction, SumMaxMeanOverInnerOuterAndAllAxes) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  const std::vector<std::vector<int64_t>> axes_list = {{2}, {0}, {1}, {0, 2}, {0, 1, 2}};
  for (DataType dt : {DataType::Float, DataType::Double, DataType::Half, DataType::BFloat16, DataType::Int32}) {
    for (OpType op : {OpType::Sum, OpType::ReduceMax, OpType::Mean}) {
      for (const auto& axes : axes_list) {
        for (bool keepdim : {false, true}) {
          Case c;
          c.kind = Segment::Kind::Reduction;
          TensorView* x = c.input(dt, {33, 40, 257}, rng, -2, 2);
          c.outputs = {ops::reduction(op, x, axes, keepdim)};
          c.check(toString(op) + " " + toString(dt) + " axes " + shapeToString(axes) + (keepdim ? " keepdim" : ""),
                  /*loose=*/dt == DataType::Half || dt == DataType::BFloat16);
        }
      }
    }
  }
}

// Reductions over the rows of matrices with contiguous columns run the vectorized column kernel:
// one pass where the columns alone fill the GPU, row splits and a second pass over the partial
// results where they do not (few columns, many rows), rows of a slice (a stride wider than the
// row), and the generic kernel where no 16-byte vector fits (an odd column count).
TEST(CudaExecutorReduction, ColumnKernelAtBiasGradientShapes) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(37);
  const std::vector<std::vector<int64_t>> shapes = {{300, 16384}, {2000, 96}, {3, 5, 1024}, {64, 77}};
  for (DataType dt : {DataType::Float, DataType::Double, DataType::Half, DataType::BFloat16}) {
    for (OpType op : {OpType::Sum, OpType::ReduceMax, OpType::Mean}) {
      for (const auto& shape : shapes) {
        for (bool sliced : {false, true}) {
          Case c;
          c.kind = Segment::Kind::Reduction;
          TensorView* x = c.input(dt, shape, rng, -2, 2);
          std::vector<int64_t> axes(shape.size() - 1);
          std::iota(axes.begin(), axes.end(), 0);
          c.outputs = {ops::reduction(op, x, axes, false)};
          if (sliced)
            c.to_device = [](const Tensor& t) {
              std::vector<int64_t> wide = t.shape();
              wide.back() += 8;  // rows 8 elements apart beyond their width: still 16-byte aligned
              Tensor w = Tensor::empty(wide, t.dtype(), Device::cuda(0));
              Tensor view = w.slice(static_cast<int64_t>(wide.size()) - 1, 0, t.shape().back());
              view.copyFrom(t.to(Device::cuda(0)));
              return view;
            };
          c.check(toString(op) + " " + toString(dt) + " " + shapeToString(shape) + (sliced ? " sliced" : ""),
                  /*loose=*/dt == DataType::Half || dt == DataType::BFloat16);
        }
      }
    }
  }
}

// One normalization segment of `define`'s outputs on random inputs, the GPU's results against the
// CPU's; returns the GPU's (on the host).
std::vector<Tensor> checkNormSegment(
    const std::string& what, bool loose, std::mt19937& rng,
    const std::function<std::vector<TensorView*>(Fusion&, const testing_norms::InputFn&)>& define) {
  Case c;
  c.kind = Segment::Kind::Normalization;
  c.outputs = define(c.fusion, [&](DataType d, std::vector<int64_t> shape, double lo, double hi) {
    return c.input(d, std::move(shape), rng, lo, hi);
  });
  c.check(what, loose);
  return c.gpu_results;
}

// One normalization of [rows, row] in `dt` on both executors (loose below fp32).
void checkNorm(testing_norms::Norm norm, DataType dt, int64_t rows, int64_t row, std::mt19937& rng) {
  checkNormSegment(testing_norms::toString(norm) + " " + toString(dt) + " [" + std::to_string(rows) + ", " +
                       std::to_string(row) + "]",
                   /*loose=*/dt != DataType::Float, rng, [&](Fusion& f, const testing_norms::InputFn& input) {
                     return testing_norms::defineNorm(norm, f, dt, rows, row, input);
                   });
}

// LayerNorm, RMSNorm, softmax, log-softmax and LayerNorm backward (dx, dgamma, dbeta) as one
// normalization segment, against the CPU executor (which accumulates in double): rows of 1, 7,
// 4097 (no vector width divides it) and 262144 elements (the multi-pass variant).
TEST(CudaExecutorNormalization, EveryNormMatchesTheCpuAtEveryRowLengthAndDtype) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(31);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{37, 1}, {37, 7}, {9, 4097}, {64, 4096}, {3, 262144}};
  for (testing_norms::Norm norm : testing_norms::kAllNorms) {
    for (DataType dt : {DataType::Float, DataType::BFloat16, DataType::Half}) {
      for (const auto& [rows, row] : shapes) checkNorm(norm, dt, rows, row, rng);
    }
  }
}

// One executor runs a normalization segment again (its prepared launch kept from the first run and
// bound to the new tensors), with its 2-D inputs transposed in memory (other strides: prepared
// again), and as first once more; every run on new random inputs, against the CPU executor's.
TEST(CudaExecutorNormalization, ASegmentRunAgainAndWithOtherStridesMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  testing::ScopedEnv keep("MESHFUSE_CUDA_PLAN_CACHE", "1");  // the kept plans (the default; pinned)
  std::mt19937 rng(61);
  for (testing_norms::Norm norm : {testing_norms::Norm::LayerNorm, testing_norms::Norm::LayerNormBackward}) {
    Case c;
    c.kind = Segment::Kind::Normalization;
    c.outputs = testing_norms::defineNorm(norm, c.fusion, DataType::Float, 64, 300,
                                          [&](DataType d, std::vector<int64_t> shape, double lo, double hi) {
                                            return c.input(d, std::move(shape), rng, lo, hi);
                                          });
    const auto dense = c.to_device;
    const auto transposed = [](const Tensor& t) {
      Tensor d = t.to(Device::cuda(0));
      if (t.dim() != 2) return d;
      Tensor buffer = Tensor::empty({t.size(1), t.size(0)}, t.dtype(), Device::cuda(0));
      buffer.permute({1, 0}).copyFrom(d);
      return buffer.permute({1, 0});
    };
    for (int run = 0; run < 4; ++run) {
      if (run > 0) c.redraw(rng);
      c.to_device = run == 2 ? std::function<Tensor(const Tensor&)>(transposed) : dense;
      c.check(testing_norms::toString(norm) + " run " + std::to_string(run), /*loose=*/true);
    }
  }
}

// Shapes that reach the kernels' other paths: many rows per block (each block walks several row
// groups, so the alternating reduction buffers are reused between them), and rows of 12288 in
// fp32, where the backward's per-element inputs no longer fit the registers and the streaming
// variant re-reads them while its column accumulators stay in registers. In bf16 at 12288, 24 rows
// (fewer than the blocks) and 600 (each block walks several).
TEST(CudaExecutorNormalization, ManyRowsAndTheStreamingVariant) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(34);
  const std::vector<std::tuple<DataType, int64_t, int64_t>> shapes = {{DataType::BFloat16, 4096, 256},
                                                                      {DataType::Float, 3000, 96},
                                                                      {DataType::Float, 8, 12288},
                                                                      {DataType::BFloat16, 24, 12288},
                                                                      {DataType::BFloat16, 600, 12288}};
  for (testing_norms::Norm norm : testing_norms::kAllNorms) {
    for (const auto& [dt, rows, row] : shapes) checkNorm(norm, dt, rows, row, rng);
  }
}

// Rows that one block holds or streams, at sizes where runNormalization may split them over a
// cluster of two blocks that hold them (normalization.cpp): both ways give the CPU's results,
// whichever is chosen. The default (a rule: streamed rows split), split forced
// (MESHFUSE_NORM_AUTOTUNE=split), never split (=0), and timed (=1, twice: the first call times both
// and the second runs the one kept). The layer's residual LayerNorm backward is the streamed case.
TEST(CudaExecutorNormalization, LargeRowsSplitOrNotMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(37);
  for (const char* mode : {"", "split", "0", "1", "1"}) {
    ::setenv("MESHFUSE_NORM_AUTOTUNE", mode, 1);
    for (testing_norms::Norm norm : testing_norms::kAllNorms)
      for (const auto& [rows, row] : std::vector<std::pair<int64_t, int64_t>>{{600, 12288}, {2048, 4096}})
        checkNorm(norm, DataType::BFloat16, rows, row, rng);
    checkNormSegment(std::string("residual layer_norm_backward bf16 [600, 12288], MESHFUSE_NORM_AUTOTUNE=") + mode,
                     /*loose=*/true, rng, [](Fusion& f, const testing_norms::InputFn& input) {
                       return testing_norms::defineResidualLayerNormBackward(f, DataType::BFloat16, 600, 12288, input);
                     });
  }
  ::unsetenv("MESHFUSE_NORM_AUTOTUNE");
}

// By default whether a large normalization is split is a rule, not a timing, so every rank and run
// of a replicated segment (tensor parallelism's LayerNorms) computes the same bits: the default
// gives exactly the bits of forcing the rule's answer, split for the layer's residual LayerNorm
// backward (its inputs stream) and whole for a LayerNorm whose row one block holds. (A split reduces
// in another order: the two ways differ in their last bits.)
TEST(CudaExecutorNormalization, TheDefaultSplitIsARuleSoEveryRankGetsTheSameBits) {
  SKIP_WITHOUT_GPU();
  const auto run = [](const char* mode, bool streamed) {
    if (mode == nullptr) {
      ::unsetenv("MESHFUSE_NORM_AUTOTUNE");
    } else {
      ::setenv("MESHFUSE_NORM_AUTOTUNE", mode, 1);
    }
    std::mt19937 rng(38);  // the same inputs for every mode
    return checkNormSegment(std::string(streamed ? "residual layer_norm_backward" : "layer_norm") +
                                ", MESHFUSE_NORM_AUTOTUNE=" + (mode == nullptr ? "(unset)" : mode),
                            /*loose=*/true, rng, [streamed](Fusion& f, const testing_norms::InputFn& input) {
                              return streamed ? testing_norms::defineResidualLayerNormBackward(f, DataType::BFloat16,
                                                                                               600, 12288, input)
                                              : testing_norms::defineNorm(testing_norms::Norm::LayerNorm, f,
                                                                          DataType::BFloat16, 2048, 4096, input);
                            });
  };
  const auto sameBits = [](const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
  };
  for (const bool streamed : {true, false}) {
    const std::vector<Tensor> by_default = run(nullptr, streamed);
    const std::vector<Tensor> forced = run(streamed ? "split" : "0", streamed);
    ASSERT_EQ(by_default.size(), forced.size());
    for (size_t i = 0; i < forced.size(); ++i)
      EXPECT_TRUE(sameBits(by_default[i], forced[i]))
          << (streamed ? "streamed" : "held") << " rows, output " << i << ": the default ran the other way";
    if (!streamed) continue;
    // Why it matters, for the record (not asserted: equal bits would be luck, not a defect).
    const std::vector<Tensor> whole = run("0", true);
    bool differs = false;
    for (size_t i = 0; i < whole.size(); ++i) differs = differs || !sameBits(whole[i], forced[i]);
    std::printf("[   NOTE   ] the residual LayerNorm backward split and whole: %s\n",
                differs ? "different last bits" : "the same bits");
  }
  ::unsetenv("MESHFUSE_NORM_AUTOTUNE");
}

// Rows longer than one block holds, split over a thread-block cluster (the default): few long rows
// (fewer than the multiprocessors), a row the cluster covers exactly and one it does not, every norm
// and dtype, in one process, so that kernels cached for one row length meet the next (a cache key
// without the cluster size once ran an 8-block kernel under a 2-block launch). Then the same rows
// with clusters off (MESHFUSE_NORM_CLUSTER=0), through the multi-pass variant.
TEST(CudaExecutorNormalization, LongRowsSplitOverAClusterMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(36);
  for (const char* clusters : {"1", "0"}) {
    ::setenv("MESHFUSE_NORM_CLUSTER", clusters, 1);
    for (testing_norms::Norm norm : testing_norms::kAllNorms)
      for (DataType dt : {DataType::Float, DataType::BFloat16})
        for (const auto& [rows, row] : std::vector<std::pair<int64_t, int64_t>>{{3, 262144}, {5, 100000}, {40, 65536}})
          if (clusters[0] == '1' || dt == DataType::BFloat16) checkNorm(norm, dt, rows, row, rng);
  }
  ::unsetenv("MESHFUSE_NORM_CLUSTER");
}

// A bias gradient as the bf16 transformer's backward lowers it: cast to fp32, sum over the rows,
// cast back, one normalization segment with only an outer reduction. Short rows run fused; rows
// too long for the registers (49152 columns) run expr by expr: the column reduction reads the bf16
// values itself (the cast to fp32 is not written out), in one pass at 48 rows and with row splits
// at 300.
TEST(CudaExecutorNormalization, OuterOnlyReductionsAtEveryRowLength) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(35);
  for (const auto& [rows, row] :
       std::vector<std::pair<int64_t, int64_t>>{{33, 300}, {64, 12288}, {48, 49152}, {300, 49152}}) {
    Case c;
    c.kind = Segment::Kind::Normalization;
    TensorView* dy = c.input(DataType::BFloat16, {rows, row}, rng, -1, 1);
    TensorView* wide = ops::cast(dy, DataType::Float);
    // The second sum reads through a cast of a value the segment computes itself (dy * dy): that
    // product must still be computed for it.
    TensorView* squares = ops::cast(ops::binary(OpType::Mul, dy, dy), DataType::Float);
    c.outputs = {ops::cast(ops::reduction(OpType::Sum, wide, {0}, false), DataType::BFloat16),
                 ops::binary(OpType::Mul, dy, dy), ops::reduction(OpType::Sum, squares, {0}, false)};
    c.check("bias gradient [" + std::to_string(rows) + ", " + std::to_string(row) + "]", /*loose=*/true);
  }
}

// Inputs that arrive transposed in memory (the row is strided) or as a slice at an odd offset
// (rows start unaligned): the kernel indexes them per element.
TEST(CudaExecutorNormalization, NonContiguousInputs) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(32);
  for (testing_norms::Norm norm : testing_norms::kAllNorms) {
    for (int layout = 0; layout < 2; ++layout) {
      Case c;
      c.kind = Segment::Kind::Normalization;
      auto input = [&](DataType d, std::vector<int64_t> shape, double lo, double hi) {
        return c.input(d, std::move(shape), rng, lo, hi);
      };
      c.outputs = testing_norms::defineNorm(norm, c.fusion, DataType::BFloat16, 48, 520, input);
      c.to_device = [layout](const Tensor& t) {
        Tensor d = t.to(Device::cuda(0));
        if (t.shape() != std::vector<int64_t>{48, 520}) return d;
        if (layout == 0) {
          Tensor tr = Tensor::empty({520, 48}, t.dtype(), Device::cuda(0));
          tr.permute({1, 0}).copyFrom(d);
          return tr.permute({1, 0});
        }
        Tensor wide = Tensor::empty({48, 523}, t.dtype(), Device::cuda(0));
        Tensor view = wide.slice(1, 3, 520);
        view.copyFrom(d);
        return view;
      };
      c.check(testing_norms::toString(norm) + (layout == 0 ? " transposed" : " sliced"), /*loose=*/true);
    }
  }
}

// Reductions at the values that break a careless kernel: softmax rows masked with -inf (95% of
// the elements, so many threads hold only -inf, and a quarter of the rows are -inf throughout:
// NaN on both executors), and the variance of values offset by 1000 (a one-pass
// E[x^2] - E[x]^2 would lose it).
TEST(CudaExecutorNormalization, MaskedSoftmaxAndOffsetVariance) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(36);
  for (DataType dt : {DataType::Float, DataType::BFloat16}) {
    for (int64_t row : {int64_t{4096}, int64_t{12288}, int64_t{1000}}) {
      const std::string what = toString(dt) + " row " + std::to_string(row);
      {
        Case c;
        c.kind = Segment::Kind::Normalization;
        TensorView* x = ops::cast(c.input(dt, {40, row}, rng, -4, 4), DataType::Float);
        TensorView* m = c.input(DataType::Float, {40, row}, rng, 0, 1);
        TensorView* r = c.input(DataType::Float, {40, 1}, rng, 0, 1);
        Val* minus_inf = c.fusion.newScalar(DataType::Double, -std::numeric_limits<double>::infinity());
        TensorView* dead_row = ops::binary(OpType::Lt, r, c.fusion.newScalar(DataType::Double, 0.25));
        TensorView* dead = ops::binary(OpType::Lt, m, c.fusion.newScalar(DataType::Double, 0.95));
        TensorView* masked = ops::where(dead_row, minus_inf, ops::where(dead, minus_inf, x));
        const std::vector<int64_t> full = {40, row};
        TensorView* mx = ops::broadcastInDim(ops::reduction(OpType::ReduceMax, masked, {1}, false), full, {0});
        TensorView* e = ops::unary(OpType::Exp, ops::binary(OpType::Sub, masked, mx));
        TensorView* sum = ops::reduction(OpType::Sum, e, {1}, false);
        TensorView* y = ops::binary(OpType::Div, e, ops::broadcastInDim(sum, full, {0}));
        c.outputs = {ops::cast(y, dt), sum};
        c.check("masked softmax " + what, /*loose=*/dt != DataType::Float);
      }
      {
        Case c;
        c.kind = Segment::Kind::Normalization;
        TensorView* x = ops::cast(c.input(dt, {24, row}, rng, 999, 1001), DataType::Float);
        auto [var, mean] = ops::varMean(x, {1}, 0, false);
        c.outputs = {var, mean};
        c.check("offset variance " + what, /*loose=*/dt != DataType::Float);
      }
    }
  }
}

TEST(CudaExecutorNormalization, RepeatedExecutionCompilesNothing) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(33);
  Case c;
  c.kind = Segment::Kind::Normalization;
  auto input = [&](DataType d, std::vector<int64_t> shape, double lo, double hi) {
    return c.input(d, std::move(shape), rng, lo, hi);
  };
  c.outputs =
      testing_norms::defineNorm(testing_norms::Norm::LayerNormBackward, c.fusion, DataType::BFloat16, 256, 1024, input);
  c.check("first run", true);
  const int64_t compiled = cuda::kernelCompilations();
  c.check("cached run", true);
  EXPECT_EQ(cuda::kernelCompilations(), compiled);
}

// MESHFUSE_MATMUL_AUTOTUNE's values (no GPU needed): unset and unknown words give the default 8
// algorithms, 0 none (untimed), a count from 2 up that many, at most 64.
TEST(CudaMatmulSettings, AutotuneCandidateCounts) {
  EXPECT_EQ(cuda::matmulTuneCandidates(nullptr), 8);
  EXPECT_EQ(cuda::matmulTuneCandidates("0"), 0);
  EXPECT_EQ(cuda::matmulTuneCandidates("1"), 8);
  EXPECT_EQ(cuda::matmulTuneCandidates("on"), 8);
  EXPECT_EQ(cuda::matmulTuneCandidates(""), 8);
  EXPECT_EQ(cuda::matmulTuneCandidates("32"), 32);
  EXPECT_EQ(cuda::matmulTuneCandidates("2"), 2);
  EXPECT_EQ(cuda::matmulTuneCandidates("1000"), 64);
  EXPECT_EQ(cuda::matmulTuneCandidates("16x"), 8);
  EXPECT_EQ(cuda::matmulTuneCandidates("-4"), 8);
}

TEST(CudaExecutorMatmul, MatmulShapesAndDtypes) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  struct Shapes {
    std::vector<int64_t> a, b;
  };
  const std::vector<Shapes> cases = {{{64, 96}, {96, 80}}, {{3, 32, 48}, {3, 48, 40}}, {{3, 32, 48}, {48, 40}},
                                     {{48}, {48, 40}},     {{32, 48}, {48}},           {{2, 1, 16, 24}, {3, 24, 8}}};
  for (DataType dt : kFloatTypes) {
    for (const auto& s : cases) {
      Case c;
      c.kind = Segment::Kind::Matmul;
      TensorView* a = c.input(dt, s.a, rng, -1, 1);
      TensorView* b = c.input(dt, s.b, rng, -1, 1);
      c.outputs = {ops::matmul(a, b)};
      c.check("matmul " + toString(dt) + " " + shapeToString(s.a) + " @ " + shapeToString(s.b), /*loose=*/true);
    }
  }
  Case ints;  // integers run exactly (through fp64)
  ints.kind = Segment::Kind::Matmul;
  ints.outputs = {
      ops::matmul(ints.input(DataType::Int, {20, 30}, rng, -5, 5), ints.input(DataType::Int, {30, 10}, rng, -5, 5))};
  ints.check("matmul Int");
}

TEST(CudaExecutorMatmul, LinearWithAndWithoutFusedBias) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  for (DataType dt : kFloatTypes) {
    for (bool bias : {false, true}) {
      Case c;
      c.kind = Segment::Kind::Matmul;
      TensorView* x = c.input(dt, {4, 16, 64}, rng, -1, 1);
      TensorView* w = c.input(dt, {96, 64}, rng, -1, 1);
      TensorView* b = bias ? c.input(dt, {96}, rng, -1, 1) : nullptr;
      c.outputs = {ops::linear(x, w, b)};
      c.check("linear " + toString(dt) + (bias ? " +bias" : ""), /*loose=*/true);
    }
  }
}

// The tanh GELU after a linear (cuBLASLt's GELU_AUX_BIAS: the pre-activation stored too) and its
// backward after a matmul with the bias gradient (its exprs; DGELU, then the column sum; or
// DGELU_BGRAD) as the lowering folds them: the CUDA run takes the epilogues for the 16-bit types
// (counted) and matches the CPU's run of the same exprs; a row length that is not a multiple of 8
// falls back to the exprs.
TEST(CudaExecutorMatmul, GeluEpiloguesMatchTheExprsTheyStandFor) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  const cuda::GeluGradEpilogue setting = cuda::geluGradEpilogue();
  using Mode = cuda::GeluGradEpilogue;
  for (Mode mode : {Mode::Off, Mode::Dgelu, Mode::DgeluBgrad}) {
    cuda::setGeluGradEpilogue(mode);
    for (DataType dt : {DataType::BFloat16, DataType::Half, DataType::Float}) {
      for (int64_t n : {96, 60}) {
        const std::string what =
            toString(dt) + " n=" + std::to_string(n) + " dgelu mode " + std::to_string(static_cast<int>(mode));
        const int64_t runs = cuda::activationEpilogueRuns();
        {
          Case c;
          c.kind = Segment::Kind::Matmul;
          c.fold_epilogue = true;
          testing_gelu::GeluForward g = testing_gelu::geluForward(c.fusion, dt, 48, 64, n);
          for (TensorView* tv : {g.x, g.w, g.b})
            c.inputs.push_back({tv, randomTensor(tv->shape(), dt, rng, -1.5, 1.5)});
          c.outputs = {g.product, g.result};
          for (TensorView* out : c.outputs) c.fusion.addOutput(out);
          c.check("linear + gelu " + what, /*loose=*/true);
        }
        {
          Case c;
          c.kind = Segment::Kind::Matmul;
          c.fold_epilogue = true;
          testing_gelu::GeluBackward g = testing_gelu::geluBackward(c.fusion, dt, 2, 24, n, 64, /*bias_grad=*/true);
          for (TensorView* tv : {g.dy, g.w, g.aux})
            c.inputs.push_back({tv, randomTensor(tv->shape(), dt, rng, -1.5, 1.5)});
          c.outputs = {g.result, g.bias_grad};
          for (TensorView* out : c.outputs) c.fusion.addOutput(out);
          c.check("matmul * gelu' and its bias gradient " + what, /*loose=*/true);
        }
        if (dt != DataType::Float && n % 8 == 0)
          EXPECT_EQ(cuda::activationEpilogueRuns(), runs + (mode == Mode::Off ? 1 : 2))
              << what << ": the GEMMs take their epilogues";
        if (n % 8 != 0) EXPECT_EQ(cuda::activationEpilogueRuns(), runs) << what << ": aux rows not 8-aligned";
      }
    }
  }
  cuda::setGeluGradEpilogue(setting);
}

// Operands held transposed (a permuted view, as the weight gradient's dy^T) or as a slice with a
// wider row stride reach cuBLASLt as a transpose flag and a leading dimension instead of a copy;
// the numbers must equal the CPU's for each layout of A, B and the linear's x and weight.
TEST(CudaExecutorMatmul, TransposedAndStridedOperandsWithoutCopies) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  // layout 0: transposed in memory; 1: a column slice of a wider matrix (ld = cols + 8); 2: odd ld (copied)
  auto relayout = [](const Tensor& t, int layout) {
    Tensor d = t.to(Device::cuda(0));
    if (t.dim() != 2) return d;
    const int64_t rows = t.size(0), cols = t.size(1);
    if (layout == 0) {
      Tensor tr = Tensor::empty({cols, rows}, t.dtype(), Device::cuda(0));
      tr.permute({1, 0}).copyFrom(d);
      return tr.permute({1, 0});
    }
    const int64_t pad = layout == 1 ? 8 : 3;
    Tensor wide = Tensor::empty({rows, cols + pad}, t.dtype(), Device::cuda(0));
    Tensor view = wide.slice(1, 0, cols);
    view.copyFrom(d);
    return view;
  };
  for (DataType dt : kFloatTypes) {
    for (int layout = 0; layout < 3; ++layout) {
      {
        Case c;
        c.kind = Segment::Kind::Matmul;
        TensorView* a = c.input(dt, {40, 72}, rng, -1, 1);
        TensorView* b = c.input(dt, {72, 56}, rng, -1, 1);
        c.outputs = {ops::matmul(a, b)};
        c.to_device = [&](const Tensor& t) { return relayout(t, layout); };
        c.check("matmul " + toString(dt) + " layout " + std::to_string(layout), /*loose=*/true);
      }
      {
        Case c;
        c.kind = Segment::Kind::Matmul;
        TensorView* x = c.input(dt, {24, 64}, rng, -1, 1);
        TensorView* w = c.input(dt, {48, 64}, rng, -1, 1);
        TensorView* b = c.input(dt, {48}, rng, -1, 1);
        c.outputs = {ops::linear(x, w, b)};
        c.to_device = [&](const Tensor& t) { return relayout(t, layout); };
        c.check("linear " + toString(dt) + " layout " + std::to_string(layout), /*loose=*/true);
      }
    }
  }
}

// fp32 products are fp32 by default, as torch's are: a 512-long contraction matches float64 to
// fp32 rounding, where TF32 (operands rounded to 10 mantissa bits) is some 1e-3 off.
// MESHFUSE_MATMUL_TF32=1 (here its setter) allows TF32: the result then moves by about that much.
TEST(CudaExecutorMatmul, Fp32ProductsAreFp32UnlessTf32IsAllowed) {
  SKIP_WITHOUT_GPU();
  const bool setting = cuda::floatMatmulTf32();
  constexpr int64_t kM = 64, kN = 48, kK = 512;
  auto worstError = [&](bool tf32) {
    cuda::setFloatMatmulTf32(tf32);
    std::mt19937 rng(21);
    Case c;
    c.kind = Segment::Kind::Matmul;
    TensorView* x = c.input(DataType::Float, {kM, kK}, rng, -1, 1);
    TensorView* w = c.input(DataType::Float, {kN, kK}, rng, -1, 1);
    c.outputs = {ops::linear(x, w)};
    c.check(tf32 ? "fp32 linear with TF32" : "fp32 linear", /*loose=*/tf32);
    double worst = 0;
    if (c.gpu_results.empty()) return worst;
    const Tensor &xs = c.inputs[0].second, &ws = c.inputs[1].second, &ys = c.gpu_results[0];
    for (int64_t i = 0; i < kM; ++i)
      for (int64_t j = 0; j < kN; ++j) {
        double e = 0;
        for (int64_t k = 0; k < kK; ++k) e += xs.item(i * kK + k) * ws.item(j * kK + k);
        worst = std::max(worst, std::abs(ys.item(i * kN + j) - e) / (1 + std::abs(e)));
      }
    return worst;
  };
  const double fp32 = worstError(false), tf32 = worstError(true);
  cuda::setFloatMatmulTf32(setting);
  EXPECT_LT(fp32, 1e-5) << "an fp32 product off by TF32's error: TF32 must be opt-in";
  EXPECT_GT(tf32, 1e-4) << "MESHFUSE_MATMUL_TF32=1 did not round the operands to TF32";
  EXPECT_LT(tf32, 2e-2);
}

// A product above the autotuning threshold (2·m·n·k >= 1e9): its first run times the heuristic's
// candidates on the real buffers, and the result must still be the product (bf16, fp32 accumulate).
TEST(CudaExecutorMatmul, AutotunedLargeProductIsCorrect) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  for (bool bias : {false, true}) {
    Case c;
    c.kind = Segment::Kind::Matmul;
    TensorView* x = c.input(DataType::BFloat16, {1024, 512}, rng, -1, 1);
    TensorView* w = c.input(DataType::BFloat16, {1024, 512}, rng, -1, 1);
    TensorView* b = bias ? c.input(DataType::BFloat16, {1024}, rng, -1, 1) : nullptr;
    c.outputs = {ops::linear(x, w, b)};
    c.check(std::string("autotuned linear") + (bias ? " +bias" : ""), /*loose=*/true);
    c.check(std::string("autotuned linear, cached plan") + (bias ? " +bias" : ""), /*loose=*/true);
  }
}

// Strided copies to contiguous (Tensor::contiguous on CUDA): the vectorized kernel where the last
// axis is contiguous and 16-byte aligned (attention's head merge, a column slice, a batch of them),
// the generic kernel where not (odd inner extent, unaligned slice, transposed last axis). Every
// result must equal the CPU's copy bit for bit.
TEST(CudaCopies, StridedToContiguousMatchesTheCpuExactly) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  struct View {
    std::vector<int64_t> shape;
    std::function<Tensor(const Tensor&)> make;
    std::string name;
  };
  const std::vector<View> views = {
      {{2, 6, 5, 16},
       [](const Tensor& t) {
         return t.permute({0, 2, 1, 3});
       },
       "head merge"},
      {{3, 40, 24}, [](const Tensor& t) { return t.slice(2, 8, 16); }, "aligned column slice"},
      {{3, 40, 24}, [](const Tensor& t) { return t.slice(2, 3, 16); }, "unaligned column slice"},
      {{4, 7, 6},
       [](const Tensor& t) {
         return t.permute({1, 0, 2});
       },
       "odd inner extent"},
      {{8, 16},
       [](const Tensor& t) {
         return t.permute({1, 0});
       },
       "transposed"},
      {{2, 3, 4, 5, 2, 16},
       [](const Tensor& t) {
         return t.permute({3, 0, 2, 1, 4, 5});
       },
       "six axes"},
      {{2, 3, 4, 5, 2, 16},
       [](const Tensor& t) {
         return t.permute({5, 0, 2, 1, 4, 3});
       },
       "six axes, last moved"},
      {{70000, 2, 8},
       [](const Tensor& t) {
         return t.permute({1, 0, 2});
       },
       "long"}};
  for (DataType dt : {DataType::Float, DataType::BFloat16, DataType::Half, DataType::Double}) {
    for (const View& v : views) {
      Tensor host = randomTensor(v.shape, dt, rng, -1, 1);
      Tensor expected = v.make(host).contiguous();
      Tensor got = v.make(host.to(Device::cuda(0))).contiguous();
      ASSERT_TRUE(got.isContiguous());
      expectClose(expected, got, v.name + " " + toString(dt));
    }
  }
}

// Copies into strided destinations: the parts of a concatenation along the last axis written into
// their slices of the result (the transformer backward's dq, dk and dv, permuted to [b, s, h, d],
// into [b, s, h, 3d]), aligned and not, and into a permuted destination; every element of the result
// is compared with the CPU's, the bytes around the written slice included.
TEST(CudaCopies, IntoStridedDestinationsMatchTheCpuExactly) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(14);
  for (DataType dt : {DataType::Float, DataType::BFloat16, DataType::Double}) {
    for (int64_t d : {16, 24, 5}) {  // 5: no 16-byte vector fits (the generic path)
      std::vector<Tensor> host_parts, device_parts;
      for (int i = 0; i < 3; ++i) {
        host_parts.push_back(randomTensor({2, 6, 5, d}, dt, rng, -1, 1));  // [b, h, s, d]
        device_parts.push_back(host_parts.back().to(Device::cuda(0)));
      }
      auto merged = [](const std::vector<Tensor>& parts) {
        std::vector<Tensor> permuted;
        for (const Tensor& p : parts) permuted.push_back(p.permute({0, 2, 1, 3}));
        return permuted;
      };
      const std::vector<int64_t> shape{2, 5, 6, 3 * d};
      Tensor expected = concatenate(merged(host_parts), 3, shape);
      Tensor got = concatenate(merged(device_parts), 3, shape);
      expectClose(expected, got, "concatenation of head merges, d = " + std::to_string(d) + " " + toString(dt));
    }
    Tensor host = randomTensor({6, 4, 32}, dt, rng, -1, 1);
    Tensor expected = Tensor::empty({4, 6, 32}, dt, Device::cpu());
    expected.permute({1, 0, 2}).copyFrom(host);
    Tensor got = Tensor::empty({4, 6, 32}, dt, Device::cuda(0));
    got.permute({1, 0, 2}).copyFrom(host.to(Device::cuda(0)));
    expectClose(expected, got, "into a permuted destination " + toString(dt));
  }
}

TEST(CudaExecutorViews, PermuteBroadcastReshapeFeedPointwise) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  {
    Case c;
    c.kind = Segment::Kind::View;
    TensorView* x = c.input(DataType::Float, {5, 6, 7}, rng);
    c.outputs = {ops::permute(x, {2, 0, 1})};
    c.check("permute");
  }
  {
    Case c;
    c.kind = Segment::Kind::View;
    TensorView* x = c.input(DataType::Half, {6}, rng);
    c.outputs = {ops::broadcastInDim(x, {4, 6}, {1})};
    c.check("broadcast_in_dim");
  }
  {
    Case c;
    c.kind = Segment::Kind::View;
    TensorView* x = c.input(DataType::Int32, {6, 10}, rng, -9, 9);
    c.outputs = {ops::reshape(x, {3, 20})};
    c.check("reshape");
  }
  {
    // A mixed segment: view then pointwise on the permuted (strided) value.
    Case c;
    TensorView* x = c.input(DataType::Float, {16, 24}, rng);
    TensorView* y = c.input(DataType::Float, {24, 16}, rng);
    c.outputs = {ops::binary(OpType::Mul, ops::permute(x, {1, 0}), y)};
    Segment seg;
    seg.kind = Segment::Kind::Pointwise;
    // The CPU executor wants one expr per view segment: run the views on the CUDA executor alone
    // and compare with a host loop.
    ShapeMap shapes;
    for (const auto& v : c.fusion.vals())
      if (v->isTensor()) shapes[v.get()] = static_cast<TensorView*>(v.get())->shape();
    for (const auto& e : c.fusion.exprs()) seg.exprs.push_back(e.get());
    seg.inputs = {x, y};
    seg.outputs = c.outputs;
    ValueMap values;
    values.tensors[x] = c.inputs[0].second.to(Device::cuda(0));
    values.tensors[y] = c.inputs[1].second.to(Device::cuda(0));
    makeCudaExecutor(0)->run(seg, values, shapes);
    Tensor out = values.tensor(c.outputs[0]).to(Device::cpu());
    Tensor expected = Tensor::empty({24, 16}, DataType::Float);
    for (int64_t i = 0; i < 24; ++i)
      for (int64_t j = 0; j < 16; ++j)
        expected.dataAs<float>()[i * 16 + j] =
            c.inputs[0].second.dataAs<float>()[j * 24 + i] * c.inputs[1].second.dataAs<float>()[i * 16 + j];
    Tensor expected_dev = expected.to(Device::cuda(0));
    expectClose(expected, expected_dev, "sanity");
    expectClose(expected, values.tensor(c.outputs[0]), "permute then mul");
    (void)out;
  }
}

TEST(CudaExecutorCache, RepeatedExecutionCompilesNothing) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  Case c;
  TensorView* x = c.input(DataType::Float, {4096}, rng);
  c.outputs = {ops::unary(OpType::Exp, ops::unary(OpType::Neg, x))};
  c.check("first run");
  const int64_t compiled = cuda::kernelCompilations();
  for (int i = 0; i < 3; ++i) c.check("cached run");
  EXPECT_EQ(cuda::kernelCompilations(), compiled) << "the same segment structure must reuse its kernel";
}

TEST(CudaRuntime, CopiesRoundTripAndMemoryIsReturned) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  const int64_t before = cuda::bytesInUse(0);
  {
    Tensor h = randomTensor({17, 33}, DataType::Float, rng, -3, 3);
    Tensor d = h.to(Device::cuda(0));
    Tensor back = d.permute({1, 0}).contiguous().permute({1, 0}).to(DataType::Double).to(Device::cpu());
    for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(back.item(i), h.item(i)) << i;
    Tensor z = Tensor::zeros({5, 5}, DataType::BFloat16, Device::cuda(0)).to(Device::cpu());
    for (int64_t i = 0; i < 25; ++i) ASSERT_EQ(z.item(i), 0.0);
    Tensor host_strided = Tensor::empty({33, 17}, DataType::Float).permute({1, 0});
    host_strided.copyFrom(d);  // device -> strided host
    for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(host_strided.item(i), h.item(i)) << i;
    EXPECT_GT(cuda::bytesInUse(0), before);
  }
  cuda::synchronizeDevice(0);
  EXPECT_EQ(cuda::bytesInUse(0), before) << "every device tensor's memory goes back to the pool";
}

TEST(CudaRuntime, TheBlockCacheHandsAFreedBlockBackOnItsStreamOnly) {
  SKIP_WITHOUT_GPU();
  testing::ScopedEnv on("MESHFUSE_CUDA_BLOCK_CACHE", "1");  // the default; pinned
  const int64_t before = cuda::bytesInUse(0);
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({1000, 3}, DataType::Float, Device::cuda(0));
    first = t.data();
  }
  EXPECT_EQ(cuda::bytesInUse(0), before) << "a cached block is not in use";
  {
    Tensor same = Tensor::empty({3000}, DataType::Float, Device::cuda(0));
    EXPECT_EQ(same.data(), first) << "the same size on the same stream takes the freed block";
  }
  {  // freed again above, it waits for the default stream: another stream never takes it
    cuda::CurrentStreamGuard guard(0, cuda::poolStream(0, 2));
    Tensor elsewhere = Tensor::empty({3000}, DataType::Float, Device::cuda(0));
    EXPECT_NE(elsewhere.data(), first);
  }
  // Results with the cache on, the same segment run many times (its blocks come back each run).
  std::mt19937 rng(14);
  Case c;
  TensorView* x = c.input(DataType::Float, {4099}, rng);
  c.outputs = {ops::unary(OpType::Exp, ops::unary(OpType::Neg, x)), ops::unary(OpType::Sigmoid, x)};
  for (int i = 0; i < 4; ++i) {
    c.redraw(rng);
    c.check("run " + std::to_string(i));
  }
  cuda::synchronizeDevice(0);
  EXPECT_EQ(cuda::bytesInUse(0), before);
}

TEST(CudaExecutorErrors, HostInputIsRejectedByName) {
  SKIP_WITHOUT_GPU();
  Fusion f;
  TensorView* x = f.newTensor(DataType::Float, {4});
  f.addInput(x);
  TensorView* y = ops::unary(OpType::Neg, x);
  Segment seg;
  seg.exprs = {f.exprs()[0].get()};
  seg.inputs = {x};
  seg.outputs = {y};
  ValueMap values;
  values.tensors[x] = Tensor::zeros({4}, DataType::Float);
  try {
    makeCudaExecutor(0)->run(seg, values, {{x, {4}}, {y, {4}}});
    FAIL() << "a CPU input must be rejected";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(x->name()), std::string::npos) << e.what();
  }
}

TEST(CudaStreams, PoolAndCurrentStream) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(cuda::currentStream(0), nullptr);
  cuda::Stream s = cuda::poolStream(0, 1);
  EXPECT_NE(s, nullptr);
  EXPECT_EQ(cuda::poolStream(0, 1 + cuda::streamPoolSize()), s);
  {
    cuda::CurrentStreamGuard guard(0, s);
    EXPECT_EQ(cuda::currentStream(0), s);
    // Work on the pool stream is correct too.
    std::mt19937 rng(13);
    Case c;
    TensorView* x = c.input(DataType::Float, {10000}, rng);
    c.outputs = {ops::unary(OpType::Sigmoid, x)};
    c.check("on a pool stream");
  }
  EXPECT_EQ(cuda::currentStream(0), nullptr);
}

}  // namespace
}  // namespace meshfuse
#endif  // MESHFUSE_HAVE_CUDA

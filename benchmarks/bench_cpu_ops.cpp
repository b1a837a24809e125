// The CPU segment executor against the same work done other ways, in one run:
//  (a) y = relu(x * a + b) * c over 64 Mi float32: one fused executor segment, vs the same four ops
//      as four single-op segments (four full passes with temporaries, what numpy does), vs a
//      hand-written single loop over all threads;
//  (b) a 2048^3 float32 linear (x @ w^T): the executor vs cblas_sgemm called directly.
// Prints Google Benchmark's rows (GB/s, GFLOP/s counters) and then a table of ratios of the
// medians of 5 randomly interleaved repetitions.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ops/ops.h"
#include "runtime/segment.h"

namespace mf = meshfuse;

namespace {

constexpr int64_t kChainElements = int64_t{64} << 20;
constexpr float kA = 1.5f, kB = -0.25f, kC = 3.0f;
constexpr int64_t kGemmSize = 2048;
constexpr int kRepetitions = 5;  // the table shows medians: single runs vary by 10% on a shared VM

mf::Tensor randomFloats(const std::vector<int64_t>& shape, uint32_t seed) {
  mf::Tensor t = mf::Tensor::empty(shape, mf::DataType::Float);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  float* p = t.dataAs<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

// The chain as a Fusion over one input x.
struct ChainFusion {
  mf::Fusion fusion;
  mf::TensorView* x;
  std::vector<mf::TensorView*> steps;  // x*a, +b, relu, *c
  ChainFusion() {
    x = fusion.newTensor(mf::DataType::Float, {kChainElements});
    fusion.addInput(x);
    auto* t1 = mf::ops::binary(mf::OpType::Mul, x, fusion.newScalar(mf::DataType::Double, kA));
    auto* t2 = mf::ops::binary(mf::OpType::Add, t1, fusion.newScalar(mf::DataType::Double, kB));
    auto* t3 = mf::ops::unary(mf::OpType::Relu, t2);
    auto* t4 = mf::ops::binary(mf::OpType::Mul, t3, fusion.newScalar(mf::DataType::Double, kC));
    steps = {t1, t2, t3, t4};
    fusion.addOutput(t4);
  }
  mf::ShapeMap shapes() const {
    mf::ShapeMap s{{x, x->shape()}};
    for (auto* tv : steps) s[tv] = tv->shape();
    return s;
  }
};

mf::Segment pointwiseSegment(std::vector<const mf::Expr*> exprs, std::vector<mf::Val*> inputs,
                             std::vector<mf::TensorView*> outputs) {
  mf::Segment seg;
  seg.kind = mf::Segment::Kind::Pointwise;
  seg.exprs = std::move(exprs);
  seg.inputs = std::move(inputs);
  seg.outputs = std::move(outputs);
  return seg;
}

// Each case checks what it computed after its timed loop (every element of the chain, 64 sampled
// entries of the product against float64 dot products): a wrong result marks the row an error
// (SkipWithError), and its ratios print n/a, rather than timing work that is not the work.
void checkChain(const mf::Tensor& x, const mf::Tensor& y, benchmark::State& state) {
  const float* in = x.dataAs<const float>();
  const float* out = y.dataAs<const float>();
  for (int64_t i = 0; i < kChainElements; ++i) {
    const double v = std::max(static_cast<double>(in[i]) * kA + kB, 0.0) * kC;
    if (std::abs(out[i] - v) > 1e-5 * (1.0 + std::abs(v))) {
      state.SkipWithError(("wrong result at element " + std::to_string(i) + ": " + std::to_string(out[i]) +
                           " instead of " + std::to_string(v))
                              .c_str());
      return;
    }
  }
}

void checkLinear(const mf::Tensor& x, const mf::Tensor& w, const mf::Tensor* bias, const mf::Tensor& y,
                 benchmark::State& state) {
  const int64_t n = kGemmSize;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  for (int sample = 0; sample < 64; ++sample) {
    const int64_t i = pick(rng), j = pick(rng);
    double want = bias ? bias->dataAs<const float>()[j] : 0.0;
    for (int64_t k = 0; k < n; ++k)
      want += static_cast<double>(x.dataAs<const float>()[i * n + k]) * w.dataAs<const float>()[j * n + k];
    const double got = y.dataAs<const float>()[i * n + j];
    if (std::abs(got - want) > 1e-4 * (1.0 + std::abs(want))) {
      state.SkipWithError(("wrong result at (" + std::to_string(i) + ", " + std::to_string(j) +
                           "): " + std::to_string(got) + " instead of " + std::to_string(want))
                              .c_str());
      return;
    }
  }
}

void setChainCounters(benchmark::State& state) {
  // Compulsory traffic: read x once, write y once. Shown as "GB" per second.
  state.counters["GB"] = benchmark::Counter(8.0 * kChainElements / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_ChainFusedExecutor(benchmark::State& state) {
  ChainFusion c;
  auto exec = mf::makeCpuExecutor();
  std::vector<const mf::Expr*> exprs;
  for (auto* tv : c.steps) exprs.push_back(tv->definition());
  mf::Segment seg = pointwiseSegment(exprs, {c.x}, {c.steps.back()});
  mf::ShapeMap shapes = c.shapes();
  mf::ValueMap values;
  values.tensors[c.x] = randomFloats({kChainElements}, 1);
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores): Google Benchmark's loop
    exec->run(seg, values, shapes);
    benchmark::DoNotOptimize(values.tensors[c.steps.back()].data());
  }
  checkChain(values.tensors[c.x], values.tensors[c.steps.back()], state);
  setChainCounters(state);
}

void BM_ChainFourPasses(benchmark::State& state) {
  ChainFusion c;
  auto exec = mf::makeCpuExecutor();
  std::vector<mf::Segment> segs;
  mf::Val* prev = c.x;
  for (auto* tv : c.steps) {
    segs.push_back(pointwiseSegment({tv->definition()}, {prev}, {tv}));
    prev = tv;
  }
  mf::ShapeMap shapes = c.shapes();
  mf::ValueMap values;
  values.tensors[c.x] = randomFloats({kChainElements}, 1);
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores): Google Benchmark's loop
    for (const auto& seg : segs) exec->run(seg, values, shapes);
    benchmark::DoNotOptimize(values.tensors[c.steps.back()].data());
    for (size_t i = 0; i + 1 < c.steps.size(); ++i) values.tensors.erase(c.steps[i]);  // temporaries die
  }
  checkChain(values.tensors[c.x], values.tensors[c.steps.back()], state);
  setChainCounters(state);
}

// Arg 0: a fresh output every call (as the executor allocates one); arg 1: one output reused, which
// leaves out the page faults of first touching new memory.
void BM_ChainHandWrittenLoop(benchmark::State& state) {
  const bool reuse_output = state.range(0) != 0;
  mf::Tensor x = randomFloats({kChainElements}, 1);
  mf::Tensor reused = mf::Tensor::zeros({kChainElements}, mf::DataType::Float);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  mf::Tensor y;
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores): Google Benchmark's loop
    y = reuse_output ? reused : mf::Tensor::empty({kChainElements}, mf::DataType::Float);
    const float* px = x.dataAs<const float>();
    float* py = y.dataAs<float>();
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([=] {
        const int64_t begin = kChainElements * t / threads, end = kChainElements * (t + 1) / threads;
        // Locals, not the closure's members: a store through py could otherwise alias them, and
        // GCC would not vectorize.
        const float* __restrict in = px;
        float* __restrict out = py;
        // relu(v) * c == relu(v * c) for c > 0; multiplying first leaves no multiply under the
        // condition, so GCC (which will not speculate a possibly trapping multiply) vectorizes.
        static_assert(kC > 0.0f);
        for (int64_t i = begin; i < end; ++i) {
          const float v = (in[i] * kA + kB) * kC;
          out[i] = v < 0.0f ? 0.0f : v;
        }
      });
    for (auto& th : pool) th.join();
    benchmark::DoNotOptimize(py);
  }
  checkChain(x, y, state);
  setChainCounters(state);
}

void setGemmCounters(benchmark::State& state) {
  const double n = static_cast<double>(kGemmSize);
  state.counters["GFLOP"] = benchmark::Counter(2.0 * n * n * n / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_LinearExecutor(benchmark::State& state) {
  const bool with_bias = state.range(0) != 0;
  mf::Fusion f;
  auto* x = f.newTensor(mf::DataType::Float, {kGemmSize, kGemmSize});
  auto* w = f.newTensor(mf::DataType::Float, {kGemmSize, kGemmSize});
  auto* b = with_bias ? f.newTensor(mf::DataType::Float, {kGemmSize}) : nullptr;
  auto* y = mf::ops::linear(x, w, b);
  mf::Segment seg;
  seg.kind = mf::Segment::Kind::Matmul;
  seg.exprs = {y->definition()};
  seg.inputs = {x, w};
  if (b) seg.inputs.push_back(b);
  seg.outputs = {y};
  mf::ShapeMap shapes{{x, x->shape()}, {w, w->shape()}, {y, y->shape()}};
  mf::ValueMap values;
  values.tensors[x] = randomFloats(x->shape(), 2);
  values.tensors[w] = randomFloats(w->shape(), 3);
  if (b) {
    shapes[b] = b->shape();
    values.tensors[b] = randomFloats(b->shape(), 4);
  }
  auto exec = mf::makeCpuExecutor();
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores): Google Benchmark's loop
    exec->run(seg, values, shapes);
    benchmark::DoNotOptimize(values.tensors[y].data());
  }
  checkLinear(values.tensors[x], values.tensors[w], b ? &values.tensors[b] : nullptr, values.tensors[y], state);
  setGemmCounters(state);
}

// Arg 0: into one reused output; arg 1: into a fresh output every call.
void BM_LinearDirectSgemm(benchmark::State& state) {
  const bool fresh_output = state.range(0) != 0;
  mf::Tensor x = randomFloats({kGemmSize, kGemmSize}, 2), w = randomFloats({kGemmSize, kGemmSize}, 3);
  mf::Tensor y = mf::Tensor::zeros({kGemmSize, kGemmSize}, mf::DataType::Float);
  const int n = static_cast<int>(kGemmSize);
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores): Google Benchmark's loop
    if (fresh_output) y = mf::Tensor::empty({kGemmSize, kGemmSize}, mf::DataType::Float);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, x.dataAs<float>(), n, w.dataAs<float>(), n,
                0.0f, y.dataAs<float>(), n);
    benchmark::DoNotOptimize(y.data());
  }
  checkLinear(x, w, nullptr, y, state);
  setGemmCounters(state);
}

// Every case: wall-clock milliseconds, the median of kRepetitions runs.
void configure(benchmark::internal::Benchmark* b) {
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5)->Repetitions(kRepetitions)->ReportAggregatesOnly();
}

BENCHMARK(BM_ChainFusedExecutor)->Apply(configure);
BENCHMARK(BM_ChainFourPasses)->Apply(configure);
BENCHMARK(BM_ChainHandWrittenLoop)->Arg(0)->Arg(1)->Apply(configure);
BENCHMARK(BM_LinearExecutor)->Arg(0)->Arg(1)->Apply(configure);
BENCHMARK(BM_LinearDirectSgemm)->Arg(0)->Arg(1)->Apply(configure);

// Collects each run's real time per iteration to print the comparison table after the rows.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  RatioReporter() : ConsoleReporter(OO_Tabular) {}  // no colour codes: the output goes into logs
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      // Keep the median of the repetitions, keyed "function[/args]".
      if (r.error_occurred || r.run_type != Run::RT_Aggregate || r.aggregate_name != "median") continue;
      Row row{r.GetAdjustedRealTime(), 0.0, ""};
      for (const auto& [name, counter] : r.counters) {
        row.rate = counter.value;
        row.unit = name;
      }
      rows_[r.run_name.function_name + (r.run_name.args.empty() ? "" : "/" + r.run_name.args)] = row;
    }
  }
  void printTable() const {
    if (rows_.empty()) return;  // --benchmark_list_tests, or a filter that matched nothing
    auto has = [&](const std::string& name) { return rows_.count(name) > 0; };
    auto row = [&](const std::string& name) { return rows_.at(name); };
    // "n/a" where a filter left out either row (0.00x read as failing the aim).
    auto speedup = [&](const std::string& name, const std::string& versus) {
      if (!has(name) || !has(versus)) return std::string("n/a");
      char text[32];
      std::snprintf(text, sizeof text, "%.2fx", row(versus).time / row(name).time);
      return std::string(text);
    };
    std::printf("\nmedians of %d repetitions\n%-28s %10s %14s   %s\n", kRepetitions, "case", "ms/iter", "rate",
                "comparison");
    auto line = [&](const std::string& name, const std::string& note) {
      if (!has(name)) return;
      const Row r = row(name);
      std::printf("%-28s %10.2f %8.1f %s/s   %s\n", name.c_str(), r.time, r.rate, r.unit.c_str(), note.c_str());
    };
    char note[200];
    std::snprintf(note, sizeof note, "%s the speed of 4 passes (aim >= 2x), %s the hand-written loop's",
                  speedup("BM_ChainFusedExecutor", "BM_ChainFourPasses").c_str(),
                  speedup("BM_ChainFusedExecutor", "BM_ChainHandWrittenLoop/0").c_str());
    line("BM_ChainFusedExecutor", note);
    line("BM_ChainFourPasses", "four single-op segments, three temporaries");
    line("BM_ChainHandWrittenLoop/0", "std::thread per core, fresh output");
    line("BM_ChainHandWrittenLoop/1", "std::thread per core, output reused (no page faults)");
    // The executor allocates its output on every call (Tensor::empty), so the fair baseline is
    // sgemm into a fresh output; the reused-output row shows what first-touch page faults cost.
    for (const char* arg : {"0", "1"}) {
      const std::string name = std::string("BM_LinearExecutor/") + arg;
      std::snprintf(note, sizeof note, "%s direct sgemm into a fresh output (aim >= 0.90x), %s into a reused one%s",
                    speedup(name, "BM_LinearDirectSgemm/1").c_str(), speedup(name, "BM_LinearDirectSgemm/0").c_str(),
                    arg[0] == '1' ? "; with a bias" : "");
      line(name, note);
    }
    line("BM_LinearDirectSgemm/0", "into a reused output");
    line("BM_LinearDirectSgemm/1", "into a fresh output every call");
  }

 private:
  struct Row {
    double time, rate;
    std::string unit;
  };
  std::map<std::string, Row> rows_;
};

}  // namespace

int main(int argc, char** argv) {
  // Interleave the repetitions of all cases at random by default: run in order, a case's place in
  // the run (warm caches, the allocator's state, another tenant's load) sways it by 10%.
  std::vector<char*> args(argv, argv + argc);
  // cppcheck-suppress variableScope ; args points into it until benchmark::Initialize has read them
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  if (std::none_of(args.begin(), args.end(), [](const char* a) {
        return std::string(a).rfind("--benchmark_enable_random_interleaving", 0) == 0;
      }))
    args.insert(args.begin() + 1, interleave.data());
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  // A mistyped flag (--benchmark-filter) was ignored and the whole run started, 64 Mi-element chains first.
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 2;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.printTable();
  benchmark::Shutdown();
  return 0;
}

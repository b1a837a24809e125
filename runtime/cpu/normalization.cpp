// Normalization segments on the CPU (LayerNorm, RMSNorm, softmax and their backward): one pass over
// the rows of the segment's iteration space F (runtime/normalization_plan.h). Per row, every
// per-element value is a buffer of one row (so the row is read from memory once and stays in
// cache for the later passes), per-row values are scalars, inner reductions reduce a buffer to a
// scalar, and outer reductions add the row into per-thread column accumulators. Values that vary
// only along a row (weights) are computed once before the row loop; those that need an outer
// reduction's result once after it. Rows are split across OpenMP threads.
//
// Per row, each stage (the steps up to and including an inner reduction) runs as ONE loop compiled
// at run time with the pointwise path's code generator (pointwise_codegen.h, host_compiler.h;
// attachKernels): its elementwise steps in registers, per-row scalars (mean, rstd) as the call's
// parameters, weights read at the row's element index, and its inner reduction and outer-reduction
// accumulations folded in the same loop; only the values a later stage or a store reads are written
// to row buffers. Interpreted, every op was its own vectorized pass over the row buffers
// (pointwise_math.h) plus one pass per reduction: perf of the 2-rank transformer step had
// applyBinary, Runner::run, sumChunk and accumulateChunk as its top non-GEMM symbols. The
// interpreter remains for Double, for stages with an op that has no generated form (a cast to a
// narrower type, pow), where compiling fails, and under MESHFUSE_CPU_CODEGEN=off or "auto" below its
// size threshold. Measured on a 2-core Xeon VM (AVX-512), [512, 1024] fp32, the transformer's
// LayerNorm (python/meshfuse/models/transformer.py), best of 20 x 50 calls, interpreted -> compiled
// in one process: forward 0.170 -> 0.140 ms, backward 0.361 -> 0.222 ms (fwd + bwd 0.531 -> 0.362,
// -32%); one thread 0.347 -> 0.277 and 0.660 -> 0.349 (1.007 -> 0.626, -38%). benchmarks/norms.py's
// RMSNorm 0.105 -> 0.089 ms; its softmax is bound by exp and the division and stays at 0.21.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "runtime/cpu/aligned_buffer.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/element_traits.h"
#include "runtime/cpu/host_compiler.h"
#include "runtime/cpu/pointwise_codegen.h"
#include "runtime/cpu/pointwise_math.h"
#include "runtime/cpu/simd_clones.h"
#include "runtime/cpu/strided_space.h"
#include "runtime/cpu/tile_io.h"
#include "runtime/normalization_plan.h"

namespace meshfuse::cpu {

namespace {

using Plan = NormalizationPlan;
using Varies = Plan::Varies;

constexpr int64_t kParallelThreshold = 1 << 15;  // elements below which one thread does it all
// Per-row outputs of at least this many bytes (together) are computed in the row buffers and
// copied out row by row, not in place in their rows. Measured on a 2-core AMD EPYC (AVX-512), one
// thread: [4096, 4096] fp32 RMSNorm 14.3 -> 10.0 ms, LayerNorm 17.0 -> 12.5; [512, 4096] 5-50%
// faster for all four norms; [512, 1024] (2 MiB, the CPU transformer layer's) within 10% either way
// (BENCHMARKS.md, CPU normalization, session 9). Why in place is slower there was not found
// (non-temporal stores for the copy changed nothing).
constexpr int64_t kInPlaceOutputBytes = int64_t{4} << 20;

// Where a value lives: a row buffer of each thread, a row scalar of each thread, a column buffer or
// scalar shared by the threads, or a constant.
enum class Home : uint8_t { RowBuffer, RowScalar, Column, Shared, Constant };

struct Ref {
  Home home = Home::Constant;
  int index = 0;
  double constant = 0;
  // A Constant that is a scalar input's value of this execution: a parameter of a compiled stage,
  // not a literal in it (each new value compiled another kernel).
  bool bound_at_execute = false;
};

enum class Phase : uint8_t { Before, PerRow, After };

// One op of the segment, resolved to homes.
struct Step {
  OpType op = OpType::Set;
  Phase phase = Phase::PerRow;
  Ref args[3];
  int nargs = 0;
  Ref out;
  DataType round_to = DataType::Float;  // Cast's target
  bool round = false;
  bool alias = false;    // broadcast_in_dim: the output is the input
  int accumulator = -1;  // outer reductions: which column accumulator
  double scale = 1;      // Mean: 1 / count
};

// A tensor read from or written to memory, walked over F: its strides along F's axes.
struct Port {
  const Val* val = nullptr;
  const Tensor* tensor = nullptr;
  Ref ref;
  Varies varies = Varies::Nothing;
  std::vector<int64_t> outer_strides;  // along F's outer axes
  StridedSpace inner;                  // F's inner axes, coalesced
  bool contiguous_row = false;         // inner is one axis of stride 1
  bool one_per_row = false;            // inner strides all 0: one element per row
  Phase phase = Phase::PerRow;
  bool every_row = false;  // an After-phase output repeated over the rows (broadcast back)
};

// The PerRow steps in stages, each run chunk by chunk along the row so that a chunk's values
// stay in L1 from one step to the next: first the stage's per-row scalar steps (once), then its
// elementwise steps, inner reductions (accumulated over the chunks) and outer-reduction
// accumulations. An inner reduction ends its stage: what follows may read its result.
struct Stage {
  std::vector<int> scalar_steps, chunk_steps;  // indices into Kernel::steps
  // The stage's chunk steps compiled into one loop (attachKernels), or null: each runs as its own
  // pass. Per chunk the loop reads `inputs` (row and column buffers) at the chunk's elements and
  // `params` (row and shared scalars) once, folds the values its reductions and outer-reduction
  // accumulations read, and writes `outputs`: the values that later stages or stores read. The
  // others stay in registers.
  TileKernel kernel = nullptr;
  std::vector<Ref> inputs, params, outputs;
};

template <typename T>
struct Kernel {
  const Plan& plan;
  std::vector<Step> steps;
  std::vector<Stage> stages;
  std::vector<Port> loads, stores;
  int row_buffers = 0, row_scalars = 0, columns = 0, shared = 0, accumulators = 0;
  std::vector<int> accumulator_column;  // the column each accumulator finalizes into
  std::vector<bool> accumulator_max;

  explicit Kernel(const Plan& p) : plan(p) {}
};

// F strides of tensor `t` holding value `v` (lined up with F by the plan).
void portStrides(const Plan& plan, const Plan::Value& info, const Tensor& t, Port& port) {
  const int rank = static_cast<int>(plan.full_shape.size());
  std::vector<int64_t> f_strides(rank, 0);
  for (size_t i = 0; i < info.axes.size(); ++i)
    if (t.size(static_cast<int64_t>(i)) != 1) f_strides[info.axes[i]] = t.strides()[i];
  port.outer_strides.assign(f_strides.begin(), f_strides.begin() + plan.split);
  port.inner.shape.assign(plan.full_shape.begin() + plan.split, plan.full_shape.end());
  port.inner.strides = {std::vector<int64_t>(f_strides.begin() + plan.split, f_strides.end())};
  port.inner.coalesce();
  port.contiguous_row = port.inner.rank() == 1 && port.inner.strides[0][0] == 1;
  port.one_per_row =
      std::all_of(port.inner.strides[0].begin(), port.inner.strides[0].end(), [](int64_t st) { return st == 0; });
}

Phase phaseOf(const Plan::Value& v) {
  if (v.after_outer_reduction) return Phase::After;
  return v.varies == Varies::PerElement || v.varies == Varies::PerRow ? Phase::PerRow : Phase::Before;
}

Port makePort(const Plan& plan, const Val* v, const Tensor& t) {
  Port port;
  port.val = v;
  port.tensor = &t;
  const Plan::Value& info = plan.value(v);
  port.varies = info.varies;
  port.phase = phaseOf(info);
  portStrides(plan, info, t, port);
  return port;
}

template <typename T>
Kernel<T> buildKernel(const Segment& seg, const Plan& plan, ValueMap& values, const ShapeMap& shapes) {
  Kernel<T> k(plan);
  std::unordered_map<const Val*, Ref> home;
  auto place = [&](const Val* v) {
    const Plan::Value& info = plan.value(v);
    Ref r;
    const Phase phase = phaseOf(info);
    if (phase == Phase::PerRow) {
      r.home = info.varies == Varies::PerElement ? Home::RowBuffer : Home::RowScalar;
      r.index = r.home == Home::RowBuffer ? k.row_buffers++ : k.row_scalars++;
    } else {
      r.home = info.varies == Varies::PerColumn ? Home::Column : Home::Shared;
      r.index = r.home == Home::Column ? k.columns++ : k.shared++;
    }
    return home[v] = r;
  };
  auto refOf = [&](const Val* v) -> Ref {
    if (!v->isTensor()) {
      Ref r;
      r.constant = values.scalar(v);
      r.bound_at_execute = !static_cast<const Scalar*>(v)->isConstant();
      return r;
    }
    if (auto it = home.find(v); it != home.end()) return it->second;
    Port port = makePort(plan, v, inputTensor(values, shapes, v));  // a segment input: loaded where it varies
    port.ref = place(v);
    k.loads.push_back(port);
    return port.ref;
  };
  for (const Expr* e : seg.exprs) {
    Step s;
    s.op = e->op();
    const Plan::Value& info = plan.value(e->out());
    s.phase = phaseOf(info);
    for (const Val* in : e->inputs()) {
      if (s.nargs == 3) break;
      s.args[s.nargs++] = refOf(in);
    }
    if (e->op() == OpType::BroadcastInDim) {
      s.alias = true;
      home[e->out()] = s.args[0];
      continue;  // nothing to compute
    }
    if (e->op() == OpType::Cast) {
      s.round = true;
      s.round_to = e->attrs().cast_to;
    }
    if (isCreation(e->op())) {
      s.round = true;
      s.round_to = e->out()->dtype();
    }
    s.out = place(e->out());
    if (isReduction(e->op())) {
      const bool outer = info.after_outer_reduction;
      const int64_t count = outer ? plan.rows : plan.row_length;
      s.scale = e->op() == OpType::Mean ? 1.0 / static_cast<double>(count) : 1.0;
      if (outer) {
        s.phase = Phase::PerRow;  // accumulates per row; finalized after the loop
        s.accumulator = k.accumulators++;
        k.accumulator_column.push_back(s.out.index);
        k.accumulator_max.push_back(e->op() == OpType::ReduceMax);
      }
    }
    k.steps.push_back(s);
  }
  for (int i = 0; i < static_cast<int>(k.steps.size()); ++i) {
    const Step& s = k.steps[i];
    if (s.phase != Phase::PerRow) continue;
    const bool scalar = s.out.home == Home::RowScalar && !isReduction(s.op);
    if (k.stages.empty() || (scalar && !k.stages.back().chunk_steps.empty())) k.stages.emplace_back();
    (scalar ? k.stages.back().scalar_steps : k.stages.back().chunk_steps).push_back(i);
    if (isReduction(s.op) && s.accumulator < 0) k.stages.emplace_back();  // an inner reduction
  }
  for (TensorView* out : seg.outputs) {
    Port port = makePort(plan, out, allocateOutput(values, shapes, out));
    port.ref = refOf(out);
    // Stored in the phase that computes it, unless it repeats over rows (an expanded value).
    const bool repeats =
        std::any_of(port.outer_strides.begin(), port.outer_strides.end(), [](int64_t st) { return st != 0; });
    if (port.phase == Phase::Before && repeats) port.phase = Phase::PerRow;
    port.every_row = port.phase == Phase::After && repeats;
    k.stores.push_back(port);
  }
  return k;
}

// Whether a and b name the same buffer or scalar (constants name none).
bool sameValue(const Ref& a, const Ref& b) {
  return a.home != Home::Constant && a.home == b.home && a.index == b.index;
}

std::atomic<int64_t> compiled_stages{0}, interpreted_stages{0};

// Whether anything but the steps `own` reads value r: another step, or a store.
bool readElsewhere(const Kernel<float>& k, const Ref& r, const std::vector<int>& own) {
  for (int i = 0; i < static_cast<int>(k.steps.size()); ++i) {
    if (std::find(own.begin(), own.end(), i) != own.end()) continue;
    const Step& s = k.steps[i];
    if (std::any_of(s.args, s.args + s.nargs, [&](const Ref& a) { return sameValue(a, r); })) return true;
  }
  return std::any_of(k.stores.begin(), k.stores.end(), [&](const Port& p) { return sameValue(p.ref, r); });
}

// The position of r in refs, appended if it is not there.
int indexIn(std::vector<Ref>& refs, const Ref& r) {
  const auto it = std::find_if(refs.begin(), refs.end(), [&](const Ref& x) { return sameValue(x, r); });
  const int index = static_cast<int>(it - refs.begin());
  if (it == refs.end()) refs.push_back(r);
  return index;
}

// One stage's chunk steps as a TileProgram, its inputs, parameters and outputs recorded in the
// stage; false where a reduction reads something other than a buffer (left to the interpreter).
bool stageProgram(const Kernel<float>& k, Stage& stage, TileProgram& tp) {
  using Kind = TileProgram::Reduction::Kind;
  std::vector<Ref> slots;  // the value each slot holds: the inputs and every step's result
  const auto slotOf = [&](const Ref& r) {
    const size_t before = slots.size();
    const int slot = indexIn(slots, r);
    if (slots.size() > before) {  // a buffer computed before the stage, or loaded
      stage.inputs.push_back(r);
      tp.input_slots.push_back(slot);
    }
    return slot;
  };
  for (int i : stage.chunk_steps) {
    const Step& s = k.steps[i];
    if (isReduction(s.op)) {
      if (s.args[0].home != Home::RowBuffer && s.args[0].home != Home::Column) return false;
      const bool max = s.op == OpType::ReduceMax;
      const bool column = s.accumulator >= 0;
      tp.reductions.push_back(
          {column ? (max ? Kind::ColumnMax : Kind::ColumnSum) : (max ? Kind::Max : Kind::Sum), slotOf(s.args[0])});
      continue;
    }
    TileProgram::Step t;
    t.op = s.op;
    t.cast_to = s.round_to;
    TileProgram::Operand* operands[3] = {&t.a, &t.b, &t.c};
    for (int a = 0; a < s.nargs; ++a) {
      const Ref& r = s.args[a];
      // A scalar input's value is a parameter too (a new entry each time: constants name no value).
      if (r.home == Home::Constant && !r.bound_at_execute)
        operands[a]->scalar = r.constant;
      else if (r.home == Home::Constant || r.home == Home::RowScalar || r.home == Home::Shared)
        operands[a]->param = indexIn(stage.params, r);
      else
        operands[a]->slot = slotOf(r);
    }
    t.out = static_cast<int>(slots.size());
    slots.push_back(s.out);
    t.writes_output = readElsewhere(k, s.out, stage.chunk_steps);
    if (t.writes_output) stage.outputs.push_back(s.out);
    tp.steps.push_back(t);
  }
  tp.num_slots = static_cast<int>(slots.size());
  tp.num_params = static_cast<int>(stage.params.size());
  return true;
}

// Compiles each stage's chunk steps into one loop (pointwise_codegen.h, host_compiler.h) where
// MESHFUSE_CPU_CODEGEN asks for it (the work: elements times chunk steps, reductions included). A
// stage with an op that has no generated form, or whose compile fails, stays interpreted.
void attachKernels(Kernel<float>& k) {
  int64_t elementwise = 0, chunk_steps = 0;
  for (const Stage& stage : k.stages) {
    for (int i : stage.chunk_steps) elementwise += isReduction(k.steps[i].op) ? 0 : 1;
    chunk_steps += static_cast<int64_t>(stage.chunk_steps.size());
  }
  if (elementwise == 0 || !codegenWanted(k.plan.rows * k.plan.row_length * chunk_steps)) return;
  for (Stage& stage : k.stages) {
    if (stage.chunk_steps.empty()) continue;
    TileProgram tp;
    if (stageProgram(k, stage, tp)) stage.kernel = compiledTileProgram(tp);
    if (stage.kernel == nullptr) {
      stage.inputs.clear();
      stage.params.clear();
      stage.outputs.clear();
    }
    ++(stage.kernel != nullptr ? compiled_stages : interpreted_stages);
  }
}

// Row loops, each built for AVX-512, AVX2 and the baseline (simd_clones.h).

// Sum of x[0, n): 16 lanes in T (vectorizable without reassociation flags; the same association
// at every vector width, so every clone gives the same bits), then double.
template <typename T>
MESHFUSE_SIMD_CLONES double sumChunk(const T* __restrict x, int64_t n) {
  constexpr int kLanes = 16;
  T lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += x[j + l];
  double sum = 0;
  for (int l = 0; l < kLanes; ++l) sum += static_cast<double>(lanes[l]);
  for (; j < n; ++j) sum += static_cast<double>(x[j]);
  return sum;
}

// 64 bytes of T as one GCC vector: each SIMD clone lowers its operations to its own registers.
template <typename T>
struct Vector64;
template <>
struct Vector64<float> {
  typedef float type __attribute__((vector_size(64)));
};
template <>
struct Vector64<double> {
  typedef double type __attribute__((vector_size(64)));
};

// Max of x[0, n) and m, NaN if any is NaN. Written with vector types: GCC does not vectorize a
// select-based max (with its NaN check) from a scalar loop, even over independent lanes.
template <typename T>
MESHFUSE_SIMD_CLONES T maxChunk(const T* __restrict x, int64_t n, T m) {
  using V = typename Vector64<T>::type;
  constexpr int64_t kLanes = sizeof(V) / sizeof(T);
  V lanes = V{} + m;
  auto nan = lanes != lanes;  // all false (m's NaN is checked below)
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    V v;
    std::memcpy(&v, x + j, sizeof v);
    lanes = v > lanes ? v : lanes;
    nan |= v != v;
  }
  bool any_nan = m != m;
  for (int64_t l = 0; l < kLanes; ++l) {
    any_nan = any_nan || nan[l] != 0;
    m = lanes[l] > m ? lanes[l] : m;
  }
  for (; j < n; ++j) {
    // cppcheck-suppress duplicateExpression ; x != x is the NaN test (true only for NaN)
    any_nan = any_nan || x[j] != x[j];
    m = x[j] > m ? x[j] : m;
  }
  return any_nan ? std::numeric_limits<T>::quiet_NaN() : m;
}

// Outer reductions: acc[j] (+)= x[j] over one chunk of a row.
template <typename T>
MESHFUSE_SIMD_CLONES void accumulateChunk(double* __restrict acc, const T* __restrict x, int64_t n, bool is_max) {
  if (is_max) {
    for (int64_t j = 0; j < n; ++j) {
      const double v = static_cast<double>(x[j]);
      acc[j] = (acc[j] != acc[j] || acc[j] > v) ? acc[j] : v;
    }
  } else {
    for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(x[j]);
  }
}

// The buffers and scalars of one thread (row homes) and the shared ones.
template <typename T>
struct Frame {
  std::vector<AlignedVector<T>> row_buffers;
  std::vector<const T*> row_ptr;  // a row buffer, or an input's memory read in place
  // Per row buffer: the output row it is written straight into (a contiguous output of type T),
  // or null. Saves copying the finished row from the buffer to the output.
  std::vector<T*> direct;
  std::vector<T> row_scalars;
  std::vector<AlignedVector<double>> accumulators;
  std::vector<const T*> kernel_in;  // a compiled stage's arguments (runKernel)
  std::vector<T*> kernel_out;
  std::vector<T> kernel_params;
};

template <typename T>
struct Shared {
  std::vector<AlignedVector<T>> columns;
  std::vector<T> scalars;
};

template <typename T>
class Runner {
 public:
  explicit Runner(const Kernel<T>& k) : k_(k), n_(k.plan.row_length), in_place_(inPlaceOutputs(k)) {
    shared_.columns.assign(k.columns, AlignedVector<T>(static_cast<size_t>(n_)));
    shared_.scalars.assign(k.shared, T(0));
  }

  void run() {
    Frame<T> setup = newFrame();
    runPhase(Phase::Before, setup, 0);
    const int64_t rows = k_.plan.rows;
    const bool parallel = rows > 1 && rows * n_ >= kParallelThreshold;
    const int threads = parallel ? omp_get_max_threads() : 1;
    std::vector<Frame<T>> frames(threads);
#pragma omp parallel num_threads(threads) if (parallel)
    {
      Frame<T>& f = frames[omp_get_thread_num()];
      f = newFrame();
#pragma omp for schedule(static)
      for (int64_t row = 0; row < rows; ++row) runPhase(Phase::PerRow, f, row);
    }
    finishOuterReductions(frames);
    runPhase(Phase::After, setup, 0);
  }

 private:
  Frame<T> newFrame() const {
    Frame<T> f;
    for (int i = 0; i < k_.row_buffers; ++i) f.row_buffers.emplace_back(static_cast<size_t>(std::max<int64_t>(n_, 1)));
    f.row_ptr.resize(k_.row_buffers);
    for (int i = 0; i < k_.row_buffers; ++i) f.row_ptr[i] = f.row_buffers[i].data();
    f.direct.assign(k_.row_buffers, nullptr);
    f.row_scalars.assign(k_.row_scalars, T(0));
    for (size_t a = 0; a < k_.accumulator_max.size(); ++a)
      f.accumulators.emplace_back(static_cast<size_t>(n_),
                                  k_.accumulator_max[a] ? -std::numeric_limits<double>::infinity() : 0.0);
    return f;
  }

  // Offset (elements) of `row` in a port's tensor.
  int64_t rowOffset(const Port& p, int64_t row) const {
    // Row 0 is at offset 0. Also where there are no rows at all (an outer reduction over an empty
    // axis), whose After-phase stores still use row 0 and whose extent of 0 would divide by zero.
    if (row == 0) return 0;
    int64_t off = 0;
    for (int64_t d = k_.plan.split - 1; d >= 0; --d) {
      const int64_t extent = k_.plan.full_shape[d];
      off += (row % extent) * p.outer_strides[d];
      row /= extent;
    }
    return off;
  }

  T scalarOf(const Ref& r, const Frame<T>& f) const {
    switch (r.home) {
      case Home::RowScalar: return f.row_scalars[r.index];
      case Home::Shared: return shared_.scalars[r.index];
      case Home::Constant: return static_cast<T>(r.constant);
      default: throw std::logic_error("normalization: a buffer where a scalar is expected");
    }
  }
  bool isBuffer(const Ref& r) const { return r.home == Home::RowBuffer || r.home == Home::Column; }
  const T* bufferOf(const Ref& r, const Frame<T>& f) const {
    return r.home == Home::RowBuffer ? f.row_ptr[r.index] : shared_.columns[r.index].data();
  }
  T* writable(const Ref& r, Frame<T>& f) {
    if (r.home == Home::RowBuffer) {
      T* dst = f.direct[r.index] != nullptr ? f.direct[r.index] : f.row_buffers[r.index].data();
      f.row_ptr[r.index] = dst;
      return dst;
    }
    return shared_.columns[r.index].data();
  }
  // cppcheck-suppress constParameter ; the slot it returns is written through
  T& scalarSlot(const Ref& r, Frame<T>& f) {
    return r.home == Home::RowScalar ? f.row_scalars[r.index] : shared_.scalars[r.index];
  }
  TileOperand<T> operand(const Ref& r, const Frame<T>& f) const {
    return isBuffer(r) ? TileOperand<T>{bufferOf(r, f)} : TileOperand<T>{nullptr, scalarOf(r, f)};
  }

  void load(const Port& p, Frame<T>& f, int64_t row) {
    const int64_t base = rowOffset(p, row);
    dispatchStorage(p.tensor->dtype(), [&](auto tag) {
      using S = typename decltype(tag)::type;
      const S* data = p.tensor->dataAs<const S>() + base;
      if (!isBuffer(p.ref)) {
        scalarSlot(p.ref, f) = Elem<S>::template load<T>(data[0]);
        return;
      }
      if constexpr (std::is_same_v<S, T>) {
        if (p.contiguous_row && p.ref.home == Home::RowBuffer) {
          f.row_ptr[p.ref.index] = data;  // read in place
          return;
        }
      }
      gatherTile<S, T>(data, p.inner.shape, p.inner.strides[0], 0, n_, writable(p.ref, f));
    });
  }

  void store(const Port& p, Frame<T>& f, int64_t row) {
    const int64_t base = rowOffset(p, row);
    dispatchStorage(p.tensor->dtype(), [&](auto tag) {
      using S = typename decltype(tag)::type;
      S* data = p.tensor->dataAs<S>() + base;
      if (!isBuffer(p.ref)) {  // one value per row, repeated over the row where the output is expanded
        const S v = Elem<S>::template store<T>(scalarOf(p.ref, f));
        if (p.one_per_row) {  // a reduction's result, not expanded: written once, not once per element
          data[0] = v;
          return;
        }
        forEachInner(p, [&](int64_t, int64_t off) { data[off] = v; });
        return;
      }
      const T* src = bufferOf(p.ref, f);
      if (static_cast<const void*>(src) == data) return;  // computed in place (directOutputs)
      if (p.contiguous_row) {
        storeTile<S, T>(src, data, n_);
        return;
      }
      forEachInner(p, [&](int64_t j, int64_t off) { data[off] = Elem<S>::template store<T>(src[j]); });
    });
  }

  // f(j, offset) for each element j of a row and its offset in the port's tensor.
  template <typename F>
  void forEachInner(const Port& p, F fn) const {
    const StridedSpace& s = p.inner;
    if (s.rank() == 0) {
      fn(0, 0);
      return;
    }
    std::vector<int64_t> index, offsets;
    for (int64_t j = 0; j < n_; ++j) {
      s.locate(j, index, offsets);
      fn(j, offsets[0]);
    }
  }

  // Runs step s over elements [begin, begin + len) of the row (a scalar step: its one value).
  void step(const Step& s, Frame<T>& f, int64_t begin = 0, int64_t len = -1) {
    if (len < 0) len = n_;
    if (s.accumulator >= 0) return accumulate(s, f, begin, len);
    const bool buffer = isBuffer(s.out);
    const int64_t n = buffer ? len : 1;
    T scalar_out = T(0);
    T* out = buffer ? writable(s.out, f) + begin : &scalar_out;
    // Scalar steps run the same element functions on one-element operands.
    T one[3];
    TileOperand<T> ops[3];
    for (int i = 0; i < s.nargs; ++i) {
      ops[i] = operand(s.args[i], f);
      if (ops[i].ptr && buffer) ops[i].ptr += begin;
      if (!buffer && !ops[i].ptr) {
        one[i] = ops[i].scalar;
        ops[i].ptr = &one[i];
      }
    }
    auto pointer = [&](int i) {  // unary ops read a buffer: a scalar operand is spread first
      if (ops[i].ptr) return ops[i].ptr;
      std::fill(out, out + n, ops[i].scalar);
      return static_cast<const T*>(out);
    };
    if (s.op == OpType::Full)
      std::fill(out, out + n, static_cast<T>(s.args[0].constant));
    else if (s.op == OpType::Where)
      applyWhere<T>(ops[0], ops[1], ops[2], out, n);
    else if (isBinary(s.op))
      applyBinary<T>(s.op, ops[0], ops[1], out, n);
    else if (s.op == OpType::Cast)
      applyRounding<T>(s.round_to, pointer(0), out, n);
    else
      applyUnary<T>(s.op, pointer(0), out, n);
    if (s.round && s.op != OpType::Cast) applyRounding<T>(s.round_to, out, out, n);
    if (!buffer) scalarSlot(s.out, f) = scalar_out;
  }

  // A stage's compiled chunk steps over elements [begin, begin + len) of the row: its inner
  // reduction folds into *sum or *max, its accumulations into the frame's accumulators.
  void runKernel(const Stage& stage, Frame<T>& f, int64_t begin, int64_t len, double* sum, T* max) {
    if constexpr (std::is_same_v<T, float>) {
      f.kernel_in.clear();
      f.kernel_out.clear();
      f.kernel_params.clear();
      for (const Ref& r : stage.params) f.kernel_params.push_back(scalarOf(r, f));
      for (const Ref& r : stage.inputs) f.kernel_in.push_back(bufferOf(r, f) + begin);
      f.kernel_in.push_back(f.kernel_params.data());
      for (const Ref& r : stage.outputs) f.kernel_out.push_back(writable(r, f) + begin);
      for (int i : stage.chunk_steps) {  // the reductions' results, in step order (stageProgram)
        const Step& s = k_.steps[i];
        if (!isReduction(s.op)) continue;
        void* result = s.accumulator >= 0          ? static_cast<void*>(f.accumulators[s.accumulator].data() + begin)
                       : s.op == OpType::ReduceMax ? static_cast<void*>(max)
                                                   : static_cast<void*>(sum);
        f.kernel_out.push_back(static_cast<float*>(result));
      }
      stage.kernel(f.kernel_in.data(), f.kernel_out.data(), static_cast<long>(len));
    }
  }

  void accumulate(const Step& s, Frame<T>& f, int64_t begin, int64_t len) {
    const Ref& in = s.args[0];
    if (!isBuffer(in)) throw std::logic_error("normalization: outer reduction of a scalar");
    accumulateChunk<T>(f.accumulators[s.accumulator].data() + begin, bufferOf(in, f) + begin, len,
                       s.op == OpType::ReduceMax);
  }

  // The PerRow steps, stage by stage, each stage's elementwise steps chunk by chunk.
  void runRow(Frame<T>& f) {
    // 16 KiB of float per value: a stage's chunks stay in L2, and each step's call (its operands
    // resolved, its op dispatched) is paid once per 4096 elements. 512 (L1-sized chunks) was
    // slower at every shape measured on an AMD EPYC, one thread, three alternated rounds:
    // [512, 1024] LayerNorm 0.29-0.30 -> 0.24 ms, backward 0.50-0.53 -> 0.43-0.44; [4096, 4096]
    // LayerNorm 13.5-14.2 -> 9.8, RMSNorm 10.1-10.4 -> 7.9, backward 30.4-31.1 -> 20.4-20.6;
    // [2048, 12288] backward 42-44 -> 30-31 (BENCHMARKS.md, CPU normalization, session 10).
    constexpr int64_t kChunk = 4096;
    for (const Stage& stage : k_.stages) {
      for (int i : stage.scalar_steps) step(k_.steps[i], f);
      if (stage.chunk_steps.empty()) continue;
      double sum = 0;
      T max = -std::numeric_limits<T>::infinity();
      for (int64_t begin = 0; begin < n_; begin += kChunk) {
        const int64_t len = std::min(kChunk, n_ - begin);
        if (stage.kernel != nullptr) {
          runKernel(stage, f, begin, len, &sum, &max);
          continue;
        }
        for (int i : stage.chunk_steps) {
          const Step& s = k_.steps[i];
          if (!isReduction(s.op) || s.accumulator >= 0) {
            step(s, f, begin, len);
            continue;
          }
          const T* x = bufferOf(s.args[0], f) + begin;  // the stage's last step
          if (s.op == OpType::ReduceMax)
            max = maxChunk<T>(x, len, max);
          else
            sum += sumChunk<T>(x, len);
        }
      }
      const Step& last = k_.steps[stage.chunk_steps.back()];
      if (isReduction(last.op) && last.accumulator < 0)
        scalarSlot(last.out, f) = last.op == OpType::ReduceMax ? max : static_cast<T>(sum * last.scale);
    }
  }

  void finishOuterReductions(const std::vector<Frame<T>>& frames) {
    for (const Step& s : k_.steps) {
      if (s.accumulator < 0) continue;
      T* col = shared_.columns[s.out.index].data();
      const bool is_max = s.op == OpType::ReduceMax;
      for (int64_t j = 0; j < n_; ++j) {
        double acc = is_max ? -std::numeric_limits<double>::infinity() : 0.0;
        for (const Frame<T>& f : frames) {
          if (f.accumulators.empty()) continue;  // a thread that got no rows
          const double v = f.accumulators[s.accumulator][j];
          acc = is_max ? ((acc != acc || acc > v) ? acc : v) : acc + v;
        }
        col[j] = static_cast<T>(is_max ? acc : acc * s.scale);
      }
    }
  }

  static constexpr DataType kComputeDtype = std::is_same_v<T, float> ? DataType::Float : DataType::Double;

  // Whether the per-row outputs are computed in place in their rows (see kInPlaceOutputBytes).
  static bool inPlaceOutputs(const Kernel<T>& k) {
    int64_t bytes = 0;
    for (const Port& p : k.stores)
      if (p.phase == Phase::PerRow && p.contiguous_row && p.tensor->dtype() == kComputeDtype)
        bytes += p.tensor->numel() * static_cast<int64_t>(sizeof(T));
    return bytes < kInPlaceOutputBytes;
  }

  // Points the row buffers of contiguous float outputs at their rows in the output tensor.
  void directOutputs(Frame<T>& f, int64_t row) {
    std::fill(f.direct.begin(), f.direct.end(), nullptr);
    if (!in_place_) return;
    for (const Port& p : k_.stores) {
      if (p.phase != Phase::PerRow || p.ref.home != Home::RowBuffer || !p.contiguous_row) continue;
      if (p.tensor->dtype() != kComputeDtype) continue;
      T*& dst = f.direct[p.ref.index];
      if (dst == nullptr) dst = p.tensor->template dataAs<T>() + rowOffset(p, row);  // one output per buffer
    }
  }

  void runPhase(Phase phase, Frame<T>& f, int64_t row) {
    if (phase == Phase::PerRow) directOutputs(f, row);  // before the loads: they may write buffers
    for (const Port& p : k_.loads)
      if (p.phase == phase) load(p, f, row);
    if (phase == Phase::PerRow) {
      runRow(f);
    } else {
      for (const Step& s : k_.steps)
        if (s.phase == phase) step(s, f);
    }
    for (const Port& p : k_.stores) {
      if (p.phase != phase) continue;
      if (!p.every_row) {
        store(p, f, row);
        continue;
      }
      for (int64_t r = 0; r < k_.plan.rows; ++r) store(p, f, r);
    }
  }

  const Kernel<T>& k_;
  const int64_t n_;
  const bool in_place_;
  Shared<T> shared_;
};

}  // namespace

NormalizationCodegenCounts normalizationCodegenCounts() { return {compiled_stages.load(), interpreted_stages.load()}; }

void runNormalization(const Segment& seg, ValueMap& values, const ShapeMap& shapes) {
  std::string why;
  auto plan = planNormalization(seg.exprs, shapes, &why);
  if (!plan) throw std::logic_error("CPU normalization: " + seg.toString() + " is not a normalization segment: " + why);
  bool wide = false;
  for (const auto& [v, info] : plan->values) wide = wide || v->dtype() == DataType::Double;
  if (wide) {
    Kernel<double> k = buildKernel<double>(seg, *plan, values, shapes);
    Runner<double>(k).run();
  } else {
    Kernel<float> k = buildKernel<float>(seg, *plan, values, shapes);
    attachKernels(k);
    Runner<float>(k).run();
  }
}

}  // namespace meshfuse::cpu

// The CUDA normalization scheduler (see normalization.h).
#include "runtime/cuda/normalization.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernel_cache.h"
#include "runtime/cuda/launch_timing.h"
#include "runtime/cuda/streams.h"
#include "runtime/host_span.h"
#include "runtime/normalization_plan.h"

namespace meshfuse::cuda {

namespace {

using Program = NormalizationProgram;
using Varies = Program::Varies;
using Operand = Program::Operand;

const char* const kMainName = "meshfuse_normalization";
const char* const kEpilogueName = "meshfuse_normalization_epilogue";

// Values per thread the persistent variant keeps in registers for the row, summed over the arrays
// it holds (element and column inputs, outer accumulators): about half of the 255 registers a
// thread may have, leaving the rest to the arithmetic. Past it, the multi-pass variant runs.
constexpr int kRegisterBudget = 96;
constexpr int kMaxValuesPerArray = 32;
constexpr int kItemsTarget = 4;  // 16-byte loads in flight per thread and array
constexpr int kMultiPassThreads = 512;

bool isElement(Varies v) { return v == Varies::PerElement || v == Varies::PerColumn; }

// The strides along F's axes of tensor `t` holding a value lined up with F by `info` (0 where the
// tensor has extent 1), and what they say about the port.
std::vector<int64_t> fStrides(const NormalizationPlan& plan, const NormalizationPlan::Value& info, const Tensor& t) {
  std::vector<int64_t> f(plan.full_shape.size(), 0);
  for (size_t i = 0; i < info.axes.size(); ++i)
    if (t.size(static_cast<int64_t>(i)) != 1) f[info.axes[i]] = t.strides()[i];
  return f;
}

void describePort(const NormalizationPlan& plan, const std::vector<int64_t>& f, Program::Port& port) {
  const int rank = static_cast<int>(plan.full_shape.size());
  for (int d = 0; d < rank; ++d)
    if (f[d] != 0) (d < plan.split ? port.has_rows : port.has_columns) = true;
  // A value that varies along the row is read and written along it even where F's extent (and so
  // the tensor's stride) is 1: a row of one element.
  if (isElement(port.varies)) port.has_columns = true;
  if (port.varies == Varies::PerRow || port.varies == Varies::PerElement) port.has_rows = true;
  int64_t expected = 1;
  bool dense = true;
  for (int d = rank - 1; d >= plan.split; --d) {
    if (plan.full_shape[d] == 1) continue;
    dense = dense && f[d] == expected;
    expected *= plan.full_shape[d];
  }
  port.contiguous_row = port.has_columns && dense;
}

int ceilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// The plan of a segment, memoized: the executor prepares the segment on every execution, and
// planning (maps over every value, a few microseconds) gives the same answer for the same exprs at
// the same shapes. The key is everything planNormalization reads: each expr's op, reduction axes
// and keepdim, its operands and results (identity, dtype, local shape). Equal keys therefore mean an
// equal plan even when a new fusion reuses the addresses of a freed one.
struct PlanEntry {
  std::optional<NormalizationPlan> plan;
  std::string why;
};

std::shared_ptr<const PlanEntry> cachedPlan(const Segment& seg, const ShapeMap& shapes) {
  host_span::Scope span("normalization: plan lookup");
  std::string key;
  key.reserve(seg.exprs.size() * 96);
  auto put = [&](const auto& v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  auto val = [&](const Val* v) {
    put(v);
    put(static_cast<uint8_t>(v->dtype()));
    put(static_cast<uint8_t>(v->isTensor()));
    if (!v->isTensor()) return;
    auto it = shapes.find(v);
    if (it == shapes.end()) {
      put(int64_t{-2});  // no shape: the planner rejects, and the key says so
      return;
    }
    put(it->second.size());
    key.append(reinterpret_cast<const char*>(it->second.data()), it->second.size() * sizeof(int64_t));
  };
  for (const Expr* e : seg.exprs) {
    put(static_cast<int>(e->op()));
    put(static_cast<uint8_t>(e->attrs().keepdim));
    put(e->attrs().axes.size());
    key.append(reinterpret_cast<const char*>(e->attrs().axes.data()), e->attrs().axes.size() * sizeof(int64_t));
    put(e->inputs().size());
    for (const Val* v : e->inputs()) val(v);
    put(e->outputs().size());
    for (const Val* v : e->outputs()) val(v);
  }
  static std::mutex mutex;
  static std::unordered_map<std::string, std::shared_ptr<const PlanEntry>> plans;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = plans.find(key); it != plans.end()) return it->second;
  }
  auto entry = std::make_shared<PlanEntry>();
  entry->plan = planNormalization(seg.exprs, shapes, &entry->why);
  std::lock_guard<std::mutex> lock(mutex);
  if (plans.size() >= 512) plans.clear();  // bounded: programs come and go (tests build thousands)
  plans.emplace(std::move(key), entry);
  return entry;
}

}  // namespace

std::optional<NormalizationLaunch> prepareNormalization(const Segment& seg, const ShapeMap& shapes,
                                                        const ValueMap& values, const std::vector<Tensor>& outputs,
                                                        std::string* why) {
  host_span::Scope span("normalization: prepare");
  auto refuse = [&](const std::string& reason) -> std::optional<NormalizationLaunch> {
    if (why) *why = reason;
    return std::nullopt;
  };
  const std::shared_ptr<const PlanEntry> entry = cachedPlan(seg, shapes);
  if (!entry->plan) return refuse(entry->why);
  const NormalizationPlan* plan = &*entry->plan;
  if (plan->rows == 0 || plan->row_length == 0) return refuse("an empty iteration space");
  if (outputs.size() != seg.outputs.size()) throw std::logic_error("CUDA normalization: one tensor per output");

  NormalizationLaunch L;
  Program& p = L.program;
  p.outer_rank = plan->split;
  p.inner_rank = static_cast<int>(plan->full_shape.size()) - plan->split;
  if (p.outer_rank < 1 || p.inner_rank < 1 || p.outer_rank > 16 || p.inner_rank > 16)
    return refuse("F has " + std::to_string(p.outer_rank) + " outer and " + std::to_string(p.inner_rank) +
                  " inner axes");
  L.outer_shape.assign(plan->full_shape.begin(), plan->full_shape.begin() + plan->split);
  L.inner_shape.assign(plan->full_shape.begin() + plan->split, plan->full_shape.end());
  L.rows = plan->rows;
  L.row_length = plan->row_length;
  bool wide = false;
  for (const auto& [v, info] : plan->values) wide = wide || v->dtype() == DataType::Double;
  p.compute = wide ? DataType::Double : DataType::Float;

  std::unordered_map<const Val*, Operand> home;
  std::vector<std::vector<int64_t>> load_strides, store_strides;
  auto refOf = [&](const Val* v) -> Operand {
    if (auto it = home.find(v); it != home.end()) return it->second;
    Operand o;
    if (!v->isTensor()) {
      const auto* s = static_cast<const Scalar*>(v);
      if (s->isConstant()) {
        o.kind = Operand::Kind::Constant;
        o.value = *s->value();
      } else {
        o.kind = Operand::Kind::Scalar;
        o.index = p.num_scalars++;
        L.scalars.push_back(values.scalar(v));
        L.scalar_values.push_back(v);
      }
      return home[v] = o;
    }
    const Tensor& t = values.tensor(v);  // a segment input
    const NormalizationPlan::Value& info = plan->value(v);
    Program::Port port;
    port.dtype = t.dtype();
    port.varies = info.varies;
    const std::vector<int64_t> f = fStrides(*plan, info, t);
    describePort(*plan, f, port);
    o.kind = Operand::Kind::Load;
    o.index = static_cast<int>(p.loads.size());
    p.loads.push_back(port);
    L.loads.push_back(t);
    L.load_values.push_back(v);
    load_strides.push_back(f);
    return home[v] = o;
  };
  for (const Expr* e : seg.exprs) {
    if (e->op() == OpType::BroadcastInDim) {
      home[e->out()] = refOf(e->input(0));  // the same value, read along more axes
      continue;
    }
    Program::Step st;
    st.op = e->op();
    for (const Val* in : e->inputs()) st.args.push_back(refOf(in));
    const NormalizationPlan::Value& info = plan->value(e->out());
    st.varies = info.varies;
    st.after = info.after_outer_reduction;
    st.outer = isReduction(e->op()) && info.after_outer_reduction;
    if (e->op() == OpType::Cast || isCreation(e->op())) {
      st.round = true;
      st.round_to = e->op() == OpType::Cast ? e->attrs().cast_to : e->out()->dtype();
    }
    Operand o;
    o.kind = Operand::Kind::Temp;
    o.index = static_cast<int>(p.steps.size());
    p.steps.push_back(std::move(st));
    home[e->out()] = o;
  }
  for (size_t i = 0; i < seg.outputs.size(); ++i) {
    const TensorView* out = seg.outputs[i];
    const NormalizationPlan::Value& info = plan->value(out);
    Program::Port port;
    port.dtype = out->dtype();
    port.varies = info.varies;
    port.after = info.after_outer_reduction;
    port.value = refOf(out);
    const std::vector<int64_t> f = fStrides(*plan, info, outputs[i]);
    describePort(*plan, f, port);
    p.stores.push_back(port);
    L.stores.push_back(outputs[i]);
    store_strides.push_back(f);
  }
  if (load_strides.empty()) load_strides.emplace_back(plan->full_shape.size(), 0);
  L.strides = load_strides;
  L.strides.insert(L.strides.end(), store_strides.begin(), store_strides.end());
  // A segment whose only reductions are outer ones (a bias gradient of a bf16 linear: cast, sum
  // over the rows, cast back) with rows too long for the registers is left to the executor's
  // pointwise kernels and column-reduction kernel: this kernel would walk whole rows of up to
  // 49152 columns a few rows per block (0.66-0.91 ms for [2048, 36864-49152] bf16 on the H200,
  // about 0.3 TB/s), where the column kernel splits the columns over the whole GPU.
  const bool inner_reduction = std::any_of(p.steps.begin(), p.steps.end(),
                                           [](const Program::Step& st) { return isReduction(st.op) && !st.outer; });
  // (Nor by a cluster of blocks a row: that kernel's speed on these segments is unmeasured.)
  if (!inner_reduction) {
    const NormalizationVariant v = chooseNormalizationVariant(L, false);
    if (v.items == 0 || v.stream)
      return refuse("only outer reductions, over rows too long for the registers (" + v.key() +
                    "): the column-reduction kernel runs them");
  }
  return L;
}

void rebindNormalization(NormalizationLaunch& launch, const ValueMap& values, const std::vector<Tensor>& outputs) {
  if (outputs.size() != launch.stores.size() || launch.load_values.size() != launch.loads.size() ||
      launch.scalar_values.size() != launch.scalars.size())
    throw std::logic_error("CUDA normalization: a kept launch rebound to another segment's tensors");
  for (size_t i = 0; i < launch.loads.size(); ++i) launch.loads[i] = values.tensor(launch.load_values[i]);
  for (size_t i = 0; i < launch.scalars.size(); ++i) launch.scalars[i] = values.scalar(launch.scalar_values[i]);
  launch.stores = outputs;
}

namespace {
// Knobs for A/B runs of benchmarks/norms.py (read once): MESHFUSE_NORM_PREFETCH=0 turns the next-row
// L2 prefetch off and MESHFUSE_NORM_FENCE=0 the optimization fence; MESHFUSE_NORM_RECOMPUTE=1 sets
// NormalizationVariant::recompute, MESHFUSE_NORM_MIN_BLOCKS ::min_blocks, MESHFUSE_NORM_BUDGET and
// MESHFUSE_NORM_ITEMS the register budget and the items per thread aimed at; MESHFUSE_NORM_SPLIT=c
// splits a row that one block holds over a cluster of c blocks. The H200 measurements
// behind the defaults are in BENCHMARKS.md (CUDA normalization, session 9).
int envInt(const char* name, int fallback) {
  const char* e = std::getenv(name);
  return e != nullptr && *e != '\0' ? std::atoi(e) : fallback;
}
struct Tuning {
  bool prefetch = envInt("MESHFUSE_NORM_PREFETCH", 1) != 0;
  bool recompute = envInt("MESHFUSE_NORM_RECOMPUTE", 0) != 0;
  int min_blocks = envInt("MESHFUSE_NORM_MIN_BLOCKS", 0);
  bool fence = envInt("MESHFUSE_NORM_FENCE", 1) != 0;
  int budget = envInt("MESHFUSE_NORM_BUDGET", kRegisterBudget);
  int items = envInt("MESHFUSE_NORM_ITEMS", kItemsTarget);
  int split = envInt("MESHFUSE_NORM_SPLIT", 1);
};
const Tuning& tuning() {
  static const Tuning t;
  return t;
}
// The chosen persistent variant with what follows from it: the prefetch, and whether its chunks
// cover a row of `n` exactly.
NormalizationVariant persistentVariant(NormalizationVariant v, int64_t n) {
  v.prefetch = tuning().prefetch;
  v.exact = int64_t{v.cluster} * v.threads_x * v.items * v.vec == n;
  return v;
}
}  // namespace

namespace {
// Thread-block clusters need sm_90 or later: the device of the launch's first CUDA tensor decides
// (a launch with none, prepared only to generate code, is taken to be for sm_90).
bool clustersRunOn(const NormalizationLaunch& L) {
  for (const auto* list : {&L.loads, &L.stores})
    for (const Tensor& t : *list)
      if (t.device().type == DeviceType::CUDA) return computeCapabilityMajor(t.device().index) >= 9;
  return true;
}
}  // namespace

NormalizationVariant chooseNormalizationVariant(const NormalizationLaunch& L) {
  // Read on every call (not with the other knobs) so that a test can turn clusters on and off.
  return chooseNormalizationVariant(L, envInt("MESHFUSE_NORM_CLUSTER", 1) != 0 && clustersRunOn(L));
}

NormalizationVariant chooseNormalizationVariant(const NormalizationLaunch& L, bool allow_clusters) {
  return chooseNormalizationVariant(L, allow_clusters, tuning().split);
}

NormalizationVariant chooseNormalizationVariant(const NormalizationLaunch& L, bool allow_clusters, int split) {
  const Program& p = L.program;
  const int64_t n = L.row_length;
  const int nl = static_cast<int>(p.loads.size());
  // The element ports: what is read or written along a row by the main kernel.
  std::vector<int> ports;
  std::vector<const Tensor*> tensors;
  std::vector<const Program::Port*> infos;
  for (int l = 0; l < nl; ++l)
    if (isElement(p.loads[l].varies) && p.loads[l].has_columns) {
      ports.push_back(l);
      tensors.push_back(&L.loads[l]);
      infos.push_back(&p.loads[l]);
    }
  for (size_t o = 0; o < p.stores.size(); ++o)
    if (!p.stores[o].after && p.stores[o].has_columns) {
      ports.push_back(std::max(1, nl) + static_cast<int>(o));
      tensors.push_back(&L.stores[o]);
      infos.push_back(&p.stores[o]);
    }
  size_t narrowest = 8;
  for (const Tensor* t : tensors) narrowest = std::min(narrowest, t->itemsize());
  NormalizationVariant v;
  v.vec = std::min<int>(8, static_cast<int>(16 / narrowest));
  // A vector of `vec` elements must start every row of every dense port at an aligned address.
  auto aligned = [&](int vec) {
    if (n % vec != 0) return false;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!infos[i]->contiguous_row) continue;
      const uintptr_t bytes = std::min<uintptr_t>(16, static_cast<uintptr_t>(vec) * tensors[i]->itemsize());
      if (reinterpret_cast<uintptr_t>(tensors[i]->data()) % bytes != 0) return false;
      for (int d = 0; d < p.outer_rank; ++d)
        if (L.strides[ports[i]][d] % vec != 0) return false;
    }
    return true;
  };
  while (v.vec > 1 && !aligned(v.vec)) v.vec /= 2;

  const Tuning& tune = tuning();
  v.recompute = tune.recompute;
  v.min_blocks = tune.min_blocks;
  v.fence = tune.fence;
  int held = p.numOuterReductions(), inputs = 0;
  for (const auto& port : p.loads) inputs += port.varies == Varies::PerElement ? 1 : 0;
  if (!v.recompute)
    for (const auto& st : p.steps)  // possibly kept in registers across passes (an upper bound)
      held += st.varies == Varies::PerElement && isExpensiveNormalizationOp(st.op) ? 1 : 0;
  const int words_per_value = p.compute == DataType::Double ? 2 : 1;
  const int64_t packs = (n + v.vec - 1) / v.vec;
  // The launch shape holding `arrays` row arrays per thread, if their values fit the registers a
  // thread of that block may have (65536 per multiprocessor over the block, less ~32 for the
  // arithmetic and addressing): wide blocks have fewer (64 at 1024 threads), where a shape that
  // ignored it spilled.
  auto fit = [&](int arrays, NormalizationVariant& out, int64_t row_packs) {
    const int budget = tune.budget / words_per_value;
    const int per_array = std::max(v.vec, std::min(kMaxValuesPerArray, budget / std::max(1, arrays)) / v.vec * v.vec);
    const int items_max = per_array / v.vec;
    if (row_packs > int64_t{1024} * items_max) return false;
    int tx = ceilDiv(row_packs, std::max(1, std::min(items_max, tune.items)));
    if (tx <= 32) {
      int pow2 = 1;
      while (pow2 < tx) pow2 *= 2;
      tx = pow2;
    } else {
      tx = std::min(1024, ceilDiv(tx, 32) * 32);
    }
    out.threads_x = tx;
    out.items = ceilDiv(row_packs, tx);
    out.threads_y = tx < 128 ? std::max(1, 128 / tx) : 1;
    if ((out.threads_x * out.threads_y) % 32 != 0) out.threads_y = 32 / std::min(32, out.threads_x);
    const int cap = std::min(tune.budget, 65536 / (out.threads_x * out.threads_y) - 32);
    return arrays * out.items * v.vec * words_per_value <= cap;
  };
  // `c` (its cluster set) fits when `arrays` row shares fit each block, one row a block.
  auto clusterFits = [&](NormalizationVariant& c, int arrays) {
    return fit(arrays, c, ceilDiv(packs, c.cluster)) && c.threads_y == 1 && c.threads_x > 32;
  };
  const bool one_block_holds = fit(held + inputs, v, packs);
  // `split` (MESHFUSE_NORM_SPLIT=c, or 2 where runNormalization considers a split): a row that one
  // block holds, or whose inputs it would stream, held by a cluster of c blocks of fewer threads all
  // the same, two of different rows' clusters a multiprocessor (one's reductions and stores beside
  // the other's loads). On an H100 it sped up the GPT-3 layer's LayerNorm backwards, which stream at 12288
  // columns (236 -> 173 and 155 -> 123 us), but slowed its forward LayerNorms, its bias gradients and
  // the standalone LayerNorm backward of benchmarks/norms.py (BENCHMARKS.md, session 21), so by
  // default only the streamed rows are split (tunedVariant, below).
  if (allow_clusters && split > 1 && (one_block_holds || inputs > 0)) {
    NormalizationVariant c = v;
    c.cluster = split;
    if (clusterFits(c, held + inputs)) return persistentVariant(c, n);
  }
  if (one_block_holds) return persistentVariant(v, n);
  // Too many inputs for one block to hold the row of each: stream them (re-read per pass from L1/L2)
  // and keep only the accumulators in registers, rather than a cluster or the multi-pass variant,
  // whose outer reductions go through the workspace element by element for every row.
  if (inputs > 0) {
    NormalizationVariant s = v;
    s.stream = true;
    if (fit(held, s, packs)) return persistentVariant(s, n);
  }
  // A row past one block's registers: split over a cluster of 2, 4 or 8 blocks (the portable
  // cluster sizes), each holding an interleaved share, before multi-pass.
  // (After streaming, whose speed on the layer's backward segments at 12288 columns is measured.)
  // Expensive values (softmax's exp) are recomputed there if holding them is what does not fit.
  for (int cluster = 2; allow_clusters && cluster <= 8; cluster *= 2) {
    for (bool recompute : {v.recompute, true}) {
      NormalizationVariant c = v;
      c.cluster = cluster;
      c.recompute = recompute;
      if (clusterFits(c, (recompute ? p.numOuterReductions() : held) + inputs)) return persistentVariant(c, n);
    }
  }
  // Still too many arrays (a backward's inputs and its outer accumulators): a cluster of streaming
  // blocks, each re-reading its share of the inputs per pass and holding only the accumulators.
  for (int cluster = 2; allow_clusters && inputs > 0 && cluster <= 8; cluster *= 2) {
    NormalizationVariant c = v;
    c.cluster = cluster;
    c.stream = true;
    if (clusterFits(c, held)) return persistentVariant(c, n);
  }
  v.items = 0;  // multi-pass: the row does not fit the registers of one block
  v.recompute = v.fence = false;
  v.threads_x = kMultiPassThreads;
  v.threads_y = 1;
  return v;
}

namespace {

// What a launch needs besides the parameters, per (device, program, variant): the kernels and the
// occupancy. Looked up by the binary program key on every execution (no source, no driver query).
struct Compiled {
  KernelFunction main = nullptr, epilogue = nullptr;
  int per_sm = 1;
};

const Compiled& compiled(int device, const Program& p, const NormalizationVariant& v) {
  host_span::Scope span("normalization: kernels lookup");
  static std::mutex mutex;
  static std::map<std::pair<int, std::string>, Compiled> cache;  // nodes never move: references stay valid
  std::string key = p.key();
  key += v.key();
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find({device, key}); it != cache.end()) return it->second;
  }
  Compiled c;
  const std::string text_key = "normalization|" + key;
  c.main = cachedKernel(
      device, text_key, [&] { return generateNormalizationSource(p, v, kMainName); }, kMainName);
  DeviceGuard guard(device);
  MESHFUSE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c.per_sm, reinterpret_cast<const void*>(c.main),
                                                                    v.threads_x * v.threads_y, 0));
  c.per_sm = std::max(1, c.per_sm);
  if (p.hasEpilogue())
    c.epilogue = cachedKernel(
        device, "normalization_epilogue|" + p.key(),
        [&] { return generateNormalizationEpilogueSource(p, kEpilogueName); }, kEpilogueName);
  std::lock_guard<std::mutex> lock(mutex);
  return cache.emplace(std::make_pair(device, std::move(key)), c).first->second;
}

}  // namespace

namespace {

// Launches variant `v` (compiled as `c`) of the segment on the device's current stream.
void launchVariant(int device, const NormalizationLaunch& L, const NormalizationVariant& v, const Compiled& c) {
  host_span::Scope span("normalization: parameters");
  const Program& p = L.program;
  DeviceGuard guard(device);
  // A persistent grid: as many blocks as run at once (the row groups loop), capped at 2 blocks a
  // multiprocessor when outer reductions write a partial row per block.
  int per_sm = c.per_sm;
  const int outer = p.numOuterReductions();
  if (outer > 0) per_sm = std::min(per_sm, 2);
  const int64_t groups = (L.rows + v.threads_y - 1) / v.threads_y;
  // Clusters: whole clusters of blocks, each taking row groups (a cluster that cannot be resident
  // yet waits for one that finishes: clusters never wait on each other).
  const int64_t cluster = std::max(1, v.cluster);
  const int64_t resident = std::max<int64_t>(1, int64_t{multiprocessorCount(device)} * per_sm / cluster);
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(groups, resident)) * cluster;
  const int64_t parts = grid / cluster * v.threads_y;
  const DataType wdt = p.compute;
  Tensor workspace;
  if (outer > 0) workspace = Tensor::empty({outer * parts * L.row_length}, wdt, Device::cuda(device));

  std::vector<uint64_t> words;
  words.reserve(normalizationParamWords(p));
  auto ptr = [&](const void* q) { words.push_back(reinterpret_cast<uintptr_t>(q)); };
  for (const Tensor& t : L.loads) ptr(t.data());
  if (L.loads.empty()) ptr(nullptr);
  for (const Tensor& t : L.stores) ptr(t.data());
  ptr(outer > 0 ? workspace.data() : nullptr);
  for (double s : L.scalars) {
    uint64_t w;
    std::memcpy(&w, &s, 8);
    words.push_back(w);
  }
  if (L.scalars.empty()) words.push_back(0);
  words.push_back(static_cast<uint64_t>(L.rows));
  words.push_back(static_cast<uint64_t>(L.row_length));
  for (int64_t e : L.outer_shape) words.push_back(static_cast<uint64_t>(e));
  for (int64_t e : L.inner_shape) words.push_back(static_cast<uint64_t>(e));
  for (const auto& st : L.strides)
    for (int64_t s : st) words.push_back(static_cast<uint64_t>(s));
  words.push_back(static_cast<uint64_t>(parts));
  if (words.size() != normalizationParamWords(p))
    throw std::logic_error("CUDA normalization: parameter block size mismatch");

  const Stream stream = currentStream(device);
  if (cluster > 1)
    launchClusterKernel(c.main, static_cast<unsigned>(grid), static_cast<unsigned>(v.threads_x),
                        static_cast<unsigned>(v.threads_y), static_cast<unsigned>(cluster), stream, words.data());
  else
    launchKernel(c.main, static_cast<unsigned>(grid), static_cast<unsigned>(v.threads_x), stream, words.data(), 0, 1,
                 static_cast<unsigned>(v.threads_y));
  if (outer == 0) return;
  const int64_t tiles = (L.row_length + kNormalizationEpilogueX - 1) / kNormalizationEpilogueX;
  const int64_t eblocks = std::max<int64_t>(1, std::min<int64_t>(tiles, int64_t{multiprocessorCount(device)} * 8));
  launchKernel(c.epilogue, static_cast<unsigned>(eblocks), kNormalizationEpilogueX, stream, words.data(), 0, 1,
               kNormalizationEpilogueY);
}

// Splitting a row over a cluster (MESHFUSE_NORM_SPLIT) pays for some segments and not others: on
// an H100 it took the GPT-3 layer's two LayerNorm backwards, whose inputs one block streams, from
// 235 and 152 us to 177 and 123 (two rows in flight a multiprocessor where one 12-warp block of
// 137-146 registers a thread fitted), and slowed every normalization whose row one block holds
// (the layer's forward LayerNorms, its bias gradients, norms.py's standalone LayerNorm backward;
// BENCHMARKS.md, sessions 21-23); no estimate of the registers told the held ones apart.
//
// By default the choice is that rule (splitsByDefault): a segment is split exactly when its inputs
// would stream and a cluster of two holds them. A rule rather than a timing, because a replicated
// segment (tensor parallelism's LayerNorms, forward and backward) must run the same way on every
// rank: a split reduces in another order, so ranks that timed differently would compute replicated
// weight gradients that differ in their last bits, and replicas drift apart over training.
// MESHFUSE_NORM_AUTOTUNE=1 times instead (per process): a segment whose row one block holds or would
// stream, and that a cluster of two can hold, runs both ways on its first call of each shape (three
// launches each after a warm-up, on the call's own tensors: a segment writes only fresh outputs, so
// a repeat is harmless) and keeps the faster by more than 3%. =0 never splits, =split splits every
// such segment untimed (tests and A/B runs); read at each call. A MESHFUSE_NORM_SPLIT setting, or a
// CUDA graph being captured (timing only), skips both. Small segments (under 4M elements) are left
// whole: neither the timing nor the split is worth it there.
constexpr int64_t kTuneMinElements = int64_t{1} << 22;
constexpr int kTuneRepeats = 3;
constexpr double kTuneMargin = 0.97;

enum class SplitTuning { Off, Rule, Timed, Always };
SplitTuning splitTuning() {
  const char* e = std::getenv("MESHFUSE_NORM_AUTOTUNE");
  const std::string v = e == nullptr ? "" : e;
  if (v == "split") return SplitTuning::Always;
  if (v == "1") return SplitTuning::Timed;
  return v == "0" ? SplitTuning::Off : SplitTuning::Rule;
}

bool normalizationTuneLogEnabled() {
  static const bool enabled = std::getenv("MESHFUSE_NORM_TUNE_LOG") != nullptr;
  return enabled;
}

// The variant that splits the row over a cluster of two blocks, where one fits (else cluster 1).
NormalizationVariant chooseSplit(const NormalizationLaunch& L) {
  return chooseNormalizationVariant(L, envInt("MESHFUSE_NORM_CLUSTER", 1) != 0 && clustersRunOn(L), 2);
}

// The variant to run: `v`, or the row split over a cluster of two where the rule, or the timing, says so
// (above).
NormalizationVariant tunedVariant(int device, const NormalizationLaunch& L, const NormalizationVariant& v,
                                  const Compiled& c) {
  const SplitTuning mode = splitTuning();
  if (mode == SplitTuning::Off || tuning().split != 1 || v.cluster != 1 || L.rows * L.row_length < kTuneMinElements)
    return v;
  const NormalizationVariant split = v.items > 0 ? chooseSplit(L) : v;  // held or streamed rows
  if (mode == SplitTuning::Always) return split.cluster == 2 ? split : v;
  const auto log = [&](const std::string& what) {
    if (normalizationTuneLogEnabled())
      std::fprintf(stderr, "[meshfuse] normalization %lldx%lld %s (%d blocks a multiprocessor): %s\n",
                   static_cast<long long>(L.rows), static_cast<long long>(L.row_length), v.key().c_str(), c.per_sm,
                   what.c_str());
  };
  static std::mutex mutex;
  static std::map<std::string, bool> split_wins;  // timed: by device, program, variant and shape
  const auto key = [&] {
    return std::to_string(device) + "|" + L.program.key() + v.key() + "|" + std::to_string(L.rows) + "x" +
           std::to_string(L.row_length);
  };
  if (mode == SplitTuning::Rule) {
    const bool splits = splitsByDefault(v, split);
    if (normalizationTuneLogEnabled()) {          // once a shape
      static std::set<std::string> rules_logged;  // the same keys as split_wins
      std::lock_guard<std::mutex> lock(mutex);
      if (rules_logged.insert(key()).second)
        log(splits ? "its inputs stream: split over a cluster of two (the default rule)"
                   : "not split (the default rule splits rows whose inputs stream)");
    }
    return splits ? split : v;
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = split_wins.find(key()); it != split_wins.end()) return it->second ? split : v;
  }
  const Stream stream = currentStream(device);
  if (streamCapturing(stream)) return v;  // decided on a later call
  bool wins = false;
  if (split.cluster != 2) {
    log(v.items == 0 ? "multi-pass, not split" : "a split does not fit");
  } else {
    const Compiled& cs = compiled(device, L.program, split);
    DeviceGuard guard(device);  // the timing events belong to the launches' device
    const auto time = [&](const NormalizationVariant& variant, const Compiled& kernels) {
      return *timeLaunches(stream, kTuneRepeats, [&] {
        launchVariant(device, L, variant, kernels);  // throws on a failed launch
        return true;
      });
    };
    const float one = time(v, c);
    const float two = time(split, cs);
    wins = two < kTuneMargin * one;
    char line[160];
    std::snprintf(line, sizeof line, "one block a row %.4f ms, a cluster of two %.4f ms%s", one, two,
                  wins ? ": split" : "");
    log(line);
  }
  std::lock_guard<std::mutex> lock(mutex);
  split_wins.emplace(key(), wins);
  return wins ? split : v;
}

}  // namespace

bool splitsByDefault(const NormalizationVariant& unsplit, const NormalizationVariant& split) {
  return unsplit.cluster == 1 && unsplit.items > 0 && unsplit.stream && split.cluster == 2 && !split.stream;
}

void runNormalization(int device, const NormalizationLaunch& L) {
  host_span::Scope span("normalization: variant");
  const NormalizationVariant chosen = chooseNormalizationVariant(L);
  const Compiled& first = compiled(device, L.program, chosen);
  const NormalizationVariant v = tunedVariant(device, L, chosen, first);
  launchVariant(device, L, v, v.cluster == chosen.cluster ? first : compiled(device, L.program, v));
}

}  // namespace meshfuse::cuda

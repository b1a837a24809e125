// Fused pointwise segments: every expr of the segment runs inside ONE loop over tiles of the
// output index space, so no intermediate is ever materialized at full size. Per tile, each input
// is loaded into a small buffer (or read in place when it is contiguous, unbroadcast and already
// of the compute type), each op runs over the buffers, and the outputs are stored with rounding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "runtime/cpu/aligned_buffer.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/element_traits.h"
#include "runtime/cpu/host_compiler.h"
#include "runtime/cpu/philox_block.h"
#include "runtime/cpu/pointwise_codegen.h"
#include "runtime/cpu/pointwise_math.h"
#include "runtime/cpu/simd_clones.h"
#include "runtime/cpu/strided_space.h"
#include "runtime/cpu/tile_io.h"
#include "runtime/element.h"
#include "runtime/philox.h"

namespace meshfuse::cpu {

namespace {

constexpr int64_t kTile = 1024;                  // the most elements per tile (tileLength)
constexpr int64_t kParallelThreshold = 1 << 15;  // below this many elements threads cost more than they save
constexpr int64_t kMaxRank = 16;                 // gatherTile's index array

enum class ComputeType { Float32, Float64, Int64 };

struct Operand {
  int slot = -1;  // a tile buffer, or -1 for a scalar
  double scalar = 0;
  bool bound_at_execute = false;  // a scalar input (define_scalar without a value), not a constant
};

// Where a random op's elements sit in its global tensor: each program element's index in the op's
// own local shape, then in the global shape (this rank's block of a sharded tensor).
struct RandomIndexing {
  bool identity = true;  // the op's local shape is the program's and the tensor is not sharded
  std::vector<int64_t> program_shape, own_strides;  // own (local, contiguous) strides over the program
  std::vector<int64_t> local_shape, global_shape, offsets;
  uint64_t seed = 0, offset = 0;
  bool wide = false;  // Double output: 53-bit uniforms

  uint64_t globalIndex(int64_t program_linear) const {
    if (identity) return static_cast<uint64_t>(program_linear);
    int64_t own = 0;
    for (int64_t d = static_cast<int64_t>(program_shape.size()) - 1; d >= 0; --d) {
      own += (program_linear % program_shape[d]) * own_strides[d];
      program_linear /= program_shape[d];
    }
    uint64_t g = 0, scale = 1;
    for (int64_t d = static_cast<int64_t>(local_shape.size()) - 1; d >= 0; --d) {
      g += static_cast<uint64_t>(own % local_shape[d] + offsets[d]) * scale;
      own /= local_shape[d];
      scale *= static_cast<uint64_t>(global_shape[d]);
    }
    return g;
  }
};

struct Step {
  OpType op = OpType::Set;
  DataType cast_to = DataType::Float;  // for Cast, and for rounding a Pow to an integral result
  bool round = false;
  bool wrap_int32 = false;  // an Int32 result computed wider, wrapped to 32 bits as int32 arithmetic does
  Operand a, b, c;
  int out = -1;
  const Tensor* direct_out = nullptr;      // written straight into this output when it has the compute type
  std::shared_ptr<RandomIndexing> random;  // uniform / normal
};

struct Load {
  int slot;
  const Tensor* tensor;
  StridedSpace layout;  // one operand: the tensor's strides over the result space, coalesced
  bool direct = false;  // read in place: contiguous, unbroadcast, of the compute type
};

struct Store {
  int slot;
  const Tensor* tensor;
};

// The exprs that produce one group of same-shaped outputs, resolved to tile buffer slots.
struct Program {
  std::vector<int64_t> shape;
  std::vector<Load> loads;
  std::vector<Step> steps;
  std::vector<Store> stores;
  int num_slots = 0;
  ComputeType compute = ComputeType::Float32;
  // The steps compiled into one loop over registers (pointwise_codegen.h), or null: the interpreter
  // runs them. The random steps (drawn) still run here first, each into buffer num_slots + k, and
  // the kernel reads them as inputs after the loads.
  TileKernel kernel = nullptr;
  std::vector<size_t> drawn;
  // The kernel's parameters: the scalar inputs' values of this execution. A scalar input is a
  // parameter of the compiled loop, not a literal in it: a learning rate that changes every step
  // compiled (and loaded) a new kernel per value, 120 ms and five mappings each.
  std::vector<float> params;
};

// Ops whose result can leave the range or precision of operands of its dtype (a sum, a product),
// unlike where/max/set, which return one of them.
bool canLeaveOperandRange(OpType op) {
  switch (op) {
    case OpType::Where:
    case OpType::Max:
    case OpType::Min:
    case OpType::Relu:
    case OpType::Set:
    case OpType::Cast:
    case OpType::Full: return false;
    default: return !isComparison(op) && !isLogical(op) && !isRandom(op);
  }
}

// A value narrower than the program's computation is brought back to its dtype after each step that
// can leave it, as it is when it stands alone: an Int32 sum wraps at 2**31, a Float product in a Double
// program overflows to inf (it stayed in double, and a fusion's results depended on what else it
// computed). Half and BFloat16 keep float precision between steps in every program, as in a float one
// (and as nvFuser's fused kernels do).
void roundNarrowerResult(ComputeType compute, DataType out_dtype, Step& step) {
  if (step.round || !canLeaveOperandRange(step.op)) return;
  if (out_dtype == DataType::Int32 && compute != ComputeType::Float32) {
    step.wrap_int32 = true;
  } else if (compute == ComputeType::Float64 && isFloatingPoint(out_dtype) && out_dtype != DataType::Double) {
    step.round = true;
    step.cast_to = DataType::Float;
  }
}

// float for 16/32-bit float segments; int64 for integer segments of exact ops; double otherwise
// (any Double, or integers mixed with floats or with ops that leave the integers).
ComputeType chooseComputeType(const std::vector<const Expr*>& exprs) {
  bool wide = false, all_integer = true;
  auto visit = [&](const Val* v) {
    if (!v->isTensor()) return;
    DataType d = v->dtype();
    // Bools are 0 and 1, exact in float: they do not widen a float computation.
    if (d == DataType::Double || (isIntegral(d) && d != DataType::Bool)) wide = true;
    if (isFloatingPoint(d)) all_integer = false;
  };
  for (const Expr* e : exprs) {
    // A comparison of integers with a floating-point number compares the values (x < 0.5 holds
    // for x = 0, as in torch and numpy), not the number truncated to an integer: not an integer
    // program, and (as any integer operand makes it) a double one. A float tensor compares in
    // float with the number rounded to float, as torch does (a dropout mask's uniform >= p stays
    // a float program). Likewise a logical op tests the number itself for zero: logical_or(x, 0.5)
    // is true (it was false, 0.5 truncated to 0).
    for (const Val* v : e->inputs()) {
      visit(v);
      if (!v->isTensor() && (isComparison(e->op()) || isLogical(e->op())) && isFloatingPoint(v->dtype()))
        all_integer = false;
    }
    visit(e->out());
    if (!isExactOnIntegers(e->op())) all_integer = false;
  }
  if (all_integer) return ComputeType::Int64;
  return wide ? ComputeType::Float64 : ComputeType::Float32;
}

DataType storageDtypeOf(ComputeType c) {
  switch (c) {
    case ComputeType::Float32: return DataType::Float;
    case ComputeType::Float64: return DataType::Double;
    case ComputeType::Int64: return DataType::Int;
  }
  return DataType::Float;
}

std::shared_ptr<RandomIndexing> randomIndexing(const Segment& seg, const Expr* e, const ValueMap& values,
                                               const ShapeMap& shapes, const std::vector<int64_t>& program_shape) {
  auto r = std::make_shared<RandomIndexing>();
  const auto asCounter = [&](const Val* v, const char* what) {
    const double x = values.scalar(v);
    if (!(x >= 0) || x != std::floor(x) || x > 0x1p63)
      throw std::invalid_argument(toString(e->op()) + ": " + what + " must be a non-negative integer, got " +
                                  std::to_string(x));
    return static_cast<uint64_t>(x);
  };
  r->seed = asCounter(e->input(2), "rng_seed");
  r->offset = asCounter(e->input(3), "rng_offset");
  r->wide = e->out()->dtype() == DataType::Double;
  r->local_shape = shapeOf(shapes, e->out());
  r->global_shape = r->local_shape;
  r->offsets.assign(r->local_shape.size(), 0);
  if (auto it = seg.global_blocks.find(e->out()); it != seg.global_blocks.end()) {
    r->global_shape = it->second.global_shape;
    r->offsets = it->second.offsets;
  }
  r->program_shape = program_shape;
  r->own_strides = broadcastStrides(r->local_shape, contiguousStrides(r->local_shape), program_shape);
  r->identity = r->local_shape == program_shape && r->global_shape == r->local_shape;
  return r;
}

// Renumbers the program's tile buffers so that a value's buffer is reused once the last step reading
// it has run (the values the stores read stay to the tile's end; a step's result never shares a
// buffer with its own operands). A long chain, such as the 18-op GELU backward, then needs a few
// buffers instead of one per value, so its tiles stay long (tileLength) and the per-tile work of
// the steps is spread over more elements.
void packSlots(Program& p) {
  constexpr int kForever = std::numeric_limits<int>::max();
  std::vector<int> last_use(static_cast<size_t>(p.num_slots), -1);
  for (int i = 0; i < static_cast<int>(p.steps.size()); ++i)
    for (const Operand* o : {&p.steps[i].a, &p.steps[i].b, &p.steps[i].c})
      if (o->slot >= 0) last_use[o->slot] = i;
  for (const Store& st : p.stores) last_use[st.slot] = kForever;

  std::vector<int> renamed(static_cast<size_t>(p.num_slots), -1);
  std::vector<int> free_slots;  // kept sorted, largest first: the lowest free buffer is reused
  int count = 0;
  const auto take = [&] {
    if (free_slots.empty()) return count++;
    const int slot = free_slots.back();
    free_slots.pop_back();
    return slot;
  };
  const auto release = [&](int slot) {
    free_slots.insert(std::upper_bound(free_slots.begin(), free_slots.end(), slot, std::greater<>()), slot);
  };
  for (Load& l : p.loads) l.slot = renamed[l.slot] = take();  // all loaded at the tile's start
  for (int i = 0; i < static_cast<int>(p.steps.size()); ++i) {
    Step& step = p.steps[i];
    std::vector<int> dying;
    for (Operand* o : {&step.a, &step.b, &step.c}) {
      if (o->slot < 0) continue;
      if (last_use[o->slot] == i && std::find(dying.begin(), dying.end(), o->slot) == dying.end())
        dying.push_back(o->slot);
      o->slot = renamed[o->slot];
    }
    const int old_out = step.out;
    step.out = renamed[old_out] = take();
    for (int slot : dying) release(renamed[slot]);
    if (last_use[old_out] < i) release(step.out);  // read by no later step and not stored
  }
  for (Store& st : p.stores) st.slot = renamed[st.slot];
  p.num_slots = count;
}

// Compiles the program's steps into one loop (MESHFUSE_CPU_CODEGEN, host_compiler.h) where they
// compute in float and the program is large enough; leaves the interpreter to run them otherwise.
void attachKernel(Program& p) {
  if (p.compute != ComputeType::Float32) return;
  if (!codegenWanted(numelOf(p.shape) * static_cast<int64_t>(p.steps.size()))) return;
  TileProgram tp;
  tp.num_slots = p.num_slots;
  for (const Load& l : p.loads) tp.input_slots.push_back(l.slot);
  std::vector<size_t> drawn;
  std::vector<float> params;
  // Operands as the kernel sees them: a scalar input becomes parameter k (its value is no part of the
  // program's key), a constant stays a literal.
  const auto operand = [&](const Operand& o) -> TileProgram::Operand {
    if (o.slot >= 0 || !o.bound_at_execute) return {o.slot, o.scalar};
    params.push_back(static_cast<float>(o.scalar));  // the interpreter's static_cast<float>(scalar)
    return {-1, 0.0, static_cast<int>(params.size()) - 1};
  };
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const Step& s = p.steps[i];
    TileProgram::Step t{s.op, s.cast_to, operand(s.a), operand(s.b), operand(s.c), s.out, s.direct_out != nullptr};
    if (s.random) {
      t.input = static_cast<int>(p.loads.size() + drawn.size());
      drawn.push_back(i);
    }
    tp.steps.push_back(t);
  }
  for (const Store& st : p.stores) tp.final_outputs.push_back(st.slot);
  tp.num_params = static_cast<int>(params.size());
  p.kernel = compiledTileProgram(tp);
  if (p.kernel != nullptr) {
    p.drawn = std::move(drawn);
    p.params = std::move(params);
  }
}

Program buildProgram(const Segment& seg, const std::vector<TensorView*>& outputs, const ValueMap& values,
                     const ShapeMap& shapes) {
  Program p;
  p.shape = shapeOf(shapes, outputs.front());
  if (static_cast<int64_t>(p.shape.size()) > kMaxRank)
    throw std::invalid_argument("CPU pointwise: rank " + std::to_string(p.shape.size()) + " exceeds " +
                                std::to_string(kMaxRank));

  // The exprs these outputs depend on (a segment may hold several output groups).
  std::unordered_set<const Val*> needed(outputs.begin(), outputs.end());
  std::vector<const Expr*> exprs;
  for (auto it = seg.exprs.rbegin(); it != seg.exprs.rend(); ++it) {
    const Expr* e = *it;
    if (!isPointwise(e->op()))
      throw std::logic_error("CPU pointwise: " + toString(e->op()) + " in a pointwise segment: " + seg.toString());
    if (!needed.count(e->out())) continue;
    exprs.push_back(e);
    needed.insert(e->inputs().begin(), e->inputs().end());
  }
  std::reverse(exprs.begin(), exprs.end());
  p.compute = chooseComputeType(exprs);
  const DataType compute_dtype = storageDtypeOf(p.compute);

  std::unordered_map<const Val*, int> slot;
  auto loadSlot = [&](const Val* v) -> int {
    auto it = slot.find(v);
    if (it != slot.end()) return it->second;
    const Tensor& t = inputTensor(values, shapes, v);
    Load load{p.num_slots, &t, {}, false};
    load.layout.shape = p.shape;
    load.layout.strides = {broadcastStrides(t.shape(), t.strides(), p.shape)};
    load.layout.coalesce();
    const auto& ls = load.layout;
    load.direct = t.dtype() == compute_dtype && (ls.rank() == 0 || (ls.rank() == 1 && ls.strides[0][0] == 1));
    p.loads.push_back(std::move(load));
    return slot[v] = p.num_slots++;
  };
  for (const Expr* e : exprs) {
    Step step;
    step.op = e->op();
    step.cast_to = e->attrs().cast_to;
    Operand* operands[3] = {&step.a, &step.b, &step.c};
    if (isRandom(e->op())) step.random = randomIndexing(seg, e, values, shapes, p.shape);
    for (size_t i = 0; i < std::min<size_t>(e->inputs().size(), 3); ++i) {
      const Val* v = e->input(i);
      if (v->isTensor()) {
        operands[i]->slot = loadSlot(v);
      } else {
        operands[i]->scalar = values.scalar(v);
        operands[i]->bound_at_execute = !static_cast<const Scalar*>(v)->isConstant();
      }
    }
    DataType out_dtype = e->out()->dtype();
    // full(0.5, Bool) is true: the value as the dtype holds it, before an integer computation truncates it.
    if (e->op() == OpType::Full) step.a.scalar = representedAs(out_dtype, step.a.scalar);
    step.round = e->op() == OpType::Cast || (e->op() == OpType::Pow && !isFloatingPoint(out_dtype));
    if (e->op() == OpType::Pow || isCreation(e->op())) step.cast_to = out_dtype;
    roundNarrowerResult(p.compute, out_dtype, step);
    step.out = slot[e->out()] = p.num_slots++;
    p.steps.push_back(step);
  }
  for (TensorView* out : outputs) {
    const Tensor* t = &values.tensor(out);
    if (!slot.count(out))
      throw std::logic_error("CPU pointwise: output " + out->name() + " is not computed by " + seg.toString());
    auto it = std::find_if(p.steps.begin(), p.steps.end(), [&](const Step& s) { return s.out == slot.at(out); });
    if (it != p.steps.end() && out->dtype() == compute_dtype && !it->direct_out)
      it->direct_out = t;
    else
      p.stores.push_back({slot.at(out), t});
  }
  packSlots(p);
  attachKernel(p);
  return p;
}

// The Philox words of a tile's elements, each element's at words + pos(i): the counters the tile
// touches are drawn once each (vectorized), a counter serving 4 / W consecutive elements
// (runtime/philox.h). Unsharded (identity), the tile's elements are consecutive and so are its
// words: pos(i) = lead + i * W, lead being where the tile's first element sits in its counter.
// Otherwise the elements' global indices are followed run by run: a counter is drawn again only
// where the index leaves the previous element's counter (a shard's block, a broadcast).
struct TileWords {
  const uint32_t* words = nullptr;
  int64_t lead = 0;               // identity: the first element's word
  const uint32_t* pos = nullptr;  // otherwise: each element's first word
  int w = 1;
  const uint32_t* of(int64_t i) const { return words + (pos ? pos[i] : lead + i * w); }
};

TileWords tileWords(const RandomIndexing& r, int w, int64_t start, int64_t n) {
  // Per thread (48 KiB: not for the stack of every call). At most n counters: a counter holds at
  // least one element.
  struct alignas(kCacheLine) Scratch {
    uint64_t counter[kTile];
    uint32_t words[4 * kTile];
    uint32_t pos[kTile];
  };
  thread_local Scratch scratch;
  const uint64_t per = static_cast<uint64_t>(4 / w);
  TileWords t;
  t.words = scratch.words;
  t.w = w;
  int64_t count = 0;
  if (r.identity) {
    const uint64_t g0 = static_cast<uint64_t>(start), first = g0 / per;
    count = static_cast<int64_t>((g0 + static_cast<uint64_t>(n) - 1) / per - first + 1);
    consecutiveCounters(first, count, scratch.counter);
    t.lead = static_cast<int64_t>(g0 % per) * w;
  } else {
    uint64_t current = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t g = r.globalIndex(start + i), c = g / per;
      if (count == 0 || c != current) scratch.counter[count++] = current = c;
      scratch.pos[i] = static_cast<uint32_t>(4 * (count - 1) + static_cast<int64_t>(g % per) * w);
    }
    t.pos = scratch.pos;
  }
  philoxWords(scratch.counter, count, r.offset, r.seed, scratch.words);
  return t;
}

template <typename T>
void fillRandom(const Step& s, int64_t start, T* out, int64_t n) {
  const RandomIndexing& r = *s.random;
  const bool normal = s.op == OpType::Normal;
  const TileWords t = tileWords(r, philox::wordsPerElement(normal, r.wide), start, n);
  if (!normal && !r.wide) {  // one word an element: the vectorized formula over the words in a row
    alignas(kCacheLine) thread_local uint32_t gathered[kTile];
    const uint32_t* w = t.of(0);
    if (t.pos) {
      for (int64_t i = 0; i < n; ++i) gathered[i] = t.words[t.pos[i]];
      w = gathered;
    }
    const float lo = static_cast<float>(s.a.scalar), hi = static_cast<float>(s.b.scalar);
    if constexpr (std::is_same_v<T, float>) {
      uniformFloats(w, n, lo, hi, out);
    } else {
      alignas(kCacheLine) thread_local float uniform[kTile];
      uniformFloats(w, n, lo, hi, uniform);
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(uniform[i]);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t* w = t.of(i);
    const double v = normal ? philox::normalFrom(w, s.a.scalar, s.b.scalar, r.wide)
                            : philox::uniformFrom(w, s.a.scalar, s.b.scalar, r.wide);
    out[i] = static_cast<T>(v);
  }
}

// uniform() draws from [minval, maxval), but a draw rounded to its dtype can become maxval
// (Half: 0.9998 rounds to 1.0, a thousand times in 2^22 draws; Float: 2 + 3 * (1 - 2^-24) rounds to 5).
// Such a value steps down to the dtype's largest value below maxval.
inline uint16_t nextDown16(uint16_t bits) {  // Half and BFloat16 are sign-magnitude
  if (bits & 0x8000u) return static_cast<uint16_t>(bits + 1);
  return bits == 0 ? uint16_t{0x8001} : static_cast<uint16_t>(bits - 1);
}

// Whether any x[i] >= bound: one vectorized pass, so that the fix-up below (element by element)
// runs only on the rare tile that needs it.
template <typename T>
MESHFUSE_SIMD_CLONES bool anyAtLeast(const T* __restrict x, int64_t n, double bound) {
  int found = 0;
  for (int64_t i = 0; i < n; ++i) found |= static_cast<int>(static_cast<double>(x[i]) >= bound);
  return found != 0;
}

template <typename T>
void keepBelowMax(DataType dtype, double lo, double hi, T* out, int64_t n) {
  if (!(hi > lo) || !anyAtLeast<T>(out, n, hi)) return;
  for (int64_t i = 0; i < n; ++i) {
    if (!(static_cast<double>(out[i]) >= hi)) continue;
    dispatchStorage(dtype, [&](auto tag) {
      using S = typename decltype(tag)::type;
      if constexpr (std::is_same_v<S, HalfBits> || std::is_same_v<S, BFloat16Bits>) {
        S s = Elem<S>::template store<T>(out[i]);
        while (Elem<S>::template load<double>(s) >= hi) s.bits = nextDown16(s.bits);
        out[i] = Elem<S>::template load<T>(s);
      } else if constexpr (std::is_floating_point_v<S>) {
        S s = static_cast<S>(out[i]);
        while (static_cast<double>(s) >= hi) s = std::nextafter(s, -std::numeric_limits<S>::infinity());
        out[i] = static_cast<T>(s);
      }
    });
  }
}

// Integers computed in int64 or double (exact there up to 2**53) wrapped to 32 bits, through int64,
// whose conversion to int32 is modular (C++20).
template <typename T>
void wrapToInt32(T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = out[i];
    if constexpr (std::is_floating_point_v<T>) {
      if (!(std::fabs(v) < T(9.2e18))) continue;  // NaN or beyond int64: not an integer result
    }
    out[i] = static_cast<T>(static_cast<int32_t>(static_cast<int64_t>(v)));
  }
}

template <typename T>
void runStep(const Step& s, const std::vector<const T*>& ptr, T* out, int64_t start, int64_t n) {
  auto operand = [&](const Operand& o) {
    return o.slot >= 0 ? TileOperand<T>{ptr[o.slot]} : TileOperand<T>{nullptr, static_cast<T>(o.scalar)};
  };
  if (s.op == OpType::Full)
    std::fill(out, out + n, static_cast<T>(s.a.scalar));
  else if (s.random)
    fillRandom<T>(s, start, out, n);
  else if (s.op == OpType::Where)
    applyWhere<T>(operand(s.a), operand(s.b), operand(s.c), out, n);
  else if (isBinary(s.op))
    applyBinary<T>(s.op, operand(s.a), operand(s.b), out, n);
  else if (s.op == OpType::Cast)
    applyRounding<T>(s.cast_to, ptr[s.a.slot], out, n);
  else
    applyUnary<T>(s.op, ptr[s.a.slot], out, n);
  // A creation op's value rounded to its dtype first (full(0.1, Half) holds Half's 0.1).
  if (isCreation(s.op) && s.cast_to != DataType::Float && s.cast_to != DataType::Double)
    applyRounding<T>(s.cast_to, out, out, n);
  if (s.round && s.op != OpType::Cast) applyRounding<T>(s.cast_to, out, out, n);
  if (s.wrap_int32) wrapToInt32<T>(out, n);
  if (s.op == OpType::Uniform) keepBelowMax<T>(s.cast_to, s.a.scalar, s.b.scalar, out, n);
}

// Elements per tile: the buffers of all the program's values for one tile stay in L1 together
// (32 KiB of the core's 48, leaving room for inputs read in place). A long program (a GELU
// backward has 20 values) gets shorter tiles; with 1024-element tiles its buffers would spill to
// L2 and every step would wait on stores.
template <typename T>
int64_t tileLength(int num_slots) {
  constexpr int64_t kL1Budget = 32 * 1024;
  const int64_t fit = kL1Budget / (std::max(num_slots, 1) * static_cast<int64_t>(sizeof(T)));
  return std::clamp<int64_t>(fit / 64 * 64, 128, kTile);
}

// One tile through the compiled kernel: the random steps draw into their own buffers (after the
// slots' buffers), then the kernel reads the loaded inputs and the draws and writes the outputs:
// in place into the outputs it computes in float, and into its slot's buffer for each store.
void runKernelTile(const Program& p, float* scratch, int64_t tile_len, int64_t start, int64_t len,
                   std::vector<const float*>& ptr, std::vector<const float*>& in, std::vector<float*>& out) {
  in.clear();
  out.clear();
  for (const Load& l : p.loads) in.push_back(ptr[l.slot]);
  for (size_t k = 0; k < p.drawn.size(); ++k) {
    float* buf = scratch + (p.num_slots + static_cast<int64_t>(k)) * tile_len;
    runStep<float>(p.steps[p.drawn[k]], ptr, buf, start, len);
    in.push_back(buf);
  }
  if (!p.params.empty()) in.push_back(p.params.data());
  for (const Step& s : p.steps)
    if (s.direct_out) out.push_back(s.direct_out->dataAs<float>() + start);
  for (const Store& st : p.stores) out.push_back(scratch + st.slot * tile_len);
  p.kernel(in.data(), out.data(), static_cast<long>(len));
  for (const Store& st : p.stores) ptr[st.slot] = scratch + st.slot * tile_len;
}

template <typename T>
void runProgram(const Program& p) {
  const int64_t numel = numelOf(p.shape);
  const int64_t tile_len = tileLength<T>(p.num_slots);
  const int64_t tiles = (numel + tile_len - 1) / tile_len;
#pragma omp parallel if (numel >= kParallelThreshold)
  {
    AlignedVector<T> scratch(static_cast<size_t>((p.num_slots + static_cast<int64_t>(p.drawn.size())) * tile_len));
    std::vector<const T*> ptr(p.num_slots, nullptr);
    std::vector<const T*> kernel_in;
    std::vector<T*> kernel_out;
#pragma omp for schedule(static)
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int64_t start = tile * tile_len, len = std::min(tile_len, numel - start);
      for (const Load& l : p.loads) {
        T* buf = scratch.data() + l.slot * tile_len;
        dispatchStorage(l.tensor->dtype(), [&](auto tag) {
          using S = typename decltype(tag)::type;
          const S* base = l.tensor->dataAs<const S>();
          if constexpr (std::is_same_v<S, T>) {
            if (l.direct) {
              ptr[l.slot] = base + start;
              return;
            }
          }
          gatherTile<S, T>(base, l.layout.shape, l.layout.strides[0], start, len, buf);
          ptr[l.slot] = buf;
        });
      }
      bool compiled = false;
      if constexpr (std::is_same_v<T, float>) {
        if (p.kernel != nullptr) {
          runKernelTile(p, scratch.data(), tile_len, start, len, ptr, kernel_in, kernel_out);
          compiled = true;
        }
      }
      for (size_t i = 0; !compiled && i < p.steps.size(); ++i) {
        const Step& s = p.steps[i];
        T* out = s.direct_out ? s.direct_out->dataAs<T>() + start : scratch.data() + s.out * tile_len;
        runStep<T>(s, ptr, out, start, len);
        ptr[s.out] = out;
      }
      for (const Store& st : p.stores) {
        dispatchStorage(st.tensor->dtype(), [&](auto tag) {
          using S = typename decltype(tag)::type;
          storeTile<S, T>(ptr[st.slot], st.tensor->dataAs<S>() + start, len);
        });
      }
    }
  }
}

}  // namespace

void runPointwise(const Segment& seg, ValueMap& values, const ShapeMap& shapes) {
  // Outputs of different shapes (one a broadcast of another) each get their own loop nest, which
  // recomputes what they share: cheaper than materializing the smaller one and reading it back.
  std::vector<std::vector<TensorView*>> groups;
  for (TensorView* out : seg.outputs) {
    allocateOutput(values, shapes, out);
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const auto& grp) { return shapeOf(shapes, grp.front()) == shapeOf(shapes, out); });
    if (g == groups.end())
      groups.push_back({out});
    else
      g->push_back(out);
  }
  for (const auto& group : groups) {
    Program p = buildProgram(seg, group, values, shapes);
    if (numelOf(p.shape) == 0) continue;
    switch (p.compute) {
      case ComputeType::Float32: runProgram<float>(p); break;
      case ComputeType::Float64: runProgram<double>(p); break;
      case ComputeType::Int64: runProgram<int64_t>(p); break;
    }
  }
}

}  // namespace meshfuse::cpu

// Fused pointwise segments: every expr of the segment runs inside ONE loop over tiles of the
// output index space, so no intermediate is ever materialized at full size. Per tile, each input
// is loaded into a small buffer (or read in place when it is contiguous, unbroadcast and already
// of the compute type), each op runs over the buffers, and the outputs are stored with rounding.
#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/element_traits.h"
#include "runtime/cpu/pointwise_math.h"
#include "runtime/cpu/strided_space.h"
#include "runtime/cpu/tile_io.h"

namespace meshfuse::cpu {

namespace {

constexpr int64_t kTile = 1024;                  // elements per tile: a few KiB per buffer, L1-resident
constexpr int64_t kParallelThreshold = 1 << 15;  // below this many elements threads cost more than they save
constexpr int64_t kMaxRank = 16;                 // gatherTile's index array

enum class ComputeType { Float32, Float64, Int64 };

struct Operand {
  int slot = -1;  // a tile buffer, or -1 for a scalar
  double scalar = 0;
};

struct Step {
  OpType op = OpType::Set;
  DataType cast_to = DataType::Float;  // for Cast, and for rounding a Pow to an integral result
  bool round = false;
  Operand a, b;
  int out = -1;
  const Tensor* direct_out = nullptr;  // written straight into this output when it has the compute type
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
};

bool isIntegerExact(OpType op) {
  switch (op) {
    case OpType::Add:
    case OpType::Sub:
    case OpType::Mul:
    case OpType::Max:
    case OpType::Min:
    case OpType::Neg:
    case OpType::Abs:
    case OpType::Relu:
    case OpType::Cast:
    case OpType::Set: return true;
    default: return false;
  }
}

// float for 16/32-bit float segments; int64 for integer segments of exact ops; double otherwise
// (any Double, or integers mixed with floats or with ops that leave the integers).
ComputeType chooseComputeType(const std::vector<const Expr*>& exprs) {
  bool wide = false, all_integer = true;
  auto visit = [&](const Val* v) {
    if (!v->isTensor()) return;
    DataType d = v->dtype();
    if (d == DataType::Double || isIntegral(d)) wide = true;
    if (isFloatingPoint(d)) all_integer = false;
  };
  for (const Expr* e : exprs) {
    for (const Val* v : e->inputs()) visit(v);
    visit(e->out());
    if (!isIntegerExact(e->op())) all_integer = false;
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
    Operand* operands[2] = {&step.a, &step.b};
    for (size_t i = 0; i < e->inputs().size(); ++i) {
      const Val* v = e->input(i);
      if (v->isTensor())
        operands[i]->slot = loadSlot(v);
      else
        operands[i]->scalar = values.scalar(v);
    }
    DataType out_dtype = e->out()->dtype();
    step.round = e->op() == OpType::Cast || (e->op() == OpType::Pow && !isFloatingPoint(out_dtype));
    if (e->op() == OpType::Pow) step.cast_to = out_dtype;
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
  return p;
}

template <typename T>
void runStep(const Step& s, const std::vector<const T*>& ptr, T* out, int64_t n) {
  auto operand = [&](const Operand& o) {
    return o.slot >= 0 ? TileOperand<T>{ptr[o.slot]} : TileOperand<T>{nullptr, static_cast<T>(o.scalar)};
  };
  if (isBinary(s.op))
    applyBinary<T>(s.op, operand(s.a), operand(s.b), out, n);
  else if (s.op == OpType::Cast)
    applyRounding<T>(s.cast_to, ptr[s.a.slot], out, n);
  else
    applyUnary<T>(s.op, ptr[s.a.slot], out, n);
  if (s.round && s.op != OpType::Cast) applyRounding<T>(s.cast_to, out, out, n);
}

template <typename T>
void runProgram(const Program& p) {
  const int64_t numel = numelOf(p.shape);
  const int64_t tiles = (numel + kTile - 1) / kTile;
#pragma omp parallel if (numel >= kParallelThreshold)
  {
    std::unique_ptr<T[]> scratch(new T[static_cast<size_t>(p.num_slots) * kTile]);
    std::vector<const T*> ptr(p.num_slots, nullptr);
#pragma omp for schedule(static)
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int64_t start = tile * kTile, len = std::min(kTile, numel - start);
      for (const Load& l : p.loads) {
        T* buf = scratch.get() + l.slot * kTile;
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
      for (const Step& s : p.steps) {
        T* out = s.direct_out ? s.direct_out->dataAs<T>() + start : scratch.get() + s.out * kTile;
        runStep<T>(s, ptr, out, len);
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

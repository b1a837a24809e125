// A seeded generator of small random fusions for the fuzz tests: random ops of ops/ops.h over
// random tiny shapes (with broadcasting and symbolic extents) and dtypes, random shardings over a
// 1-D mesh of the world, and, in a quarter of the cases, one deliberate mistake (a Mutation) that
// meshfuse must reject with a UserError. Every rank that uses the same seed builds the same case;
// `args` holds this rank's shards.
#pragma once
#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fuzz_reference.h"
#include "host_ir/fusion_executor.h"
#include "multidevice/axis_map.h"
#include "ops/ops.h"

namespace meshfuse::testing {

enum class Mutation {
  None,
  NonBroadcastingBinary,  // operands with extents 2+ that differ
  SymbolicMismatch,       // the same, hidden behind symbolic extents: caught when shapes bind
  BadReductionAxis,
  BadPermutation,
  LinearMismatchedK,
  WrongInputExtent,  // execute() gets an input one longer along an axis
  WrongInputDtype,
  WrongInputCount,
  UnevenShard,      // a sharded axis that does not split evenly over the mesh
  MismatchedSplit,  // split into more parts than the mesh has devices
  BadAxis,          // split / parallelize a loop axis that does not exist
  MeshBeyondWorld,  // a mesh naming a device the world does not have
};

inline const char* toString(Mutation m) {
  static const char* names[] = {"none",
                                "non-broadcasting binary",
                                "symbolic mismatch",
                                "bad reduction axis",
                                "bad permutation",
                                "linear mismatched K",
                                "wrong input extent",
                                "wrong input dtype",
                                "wrong input count",
                                "uneven shard",
                                "mismatched split",
                                "bad axis",
                                "mesh beyond world"};
  return names[static_cast<int>(m)];
}

struct FuzzCase {
  std::shared_ptr<Fusion> fusion = std::make_shared<Fusion>();
  std::vector<RefTensor> global_inputs;  // per fusion input, unsharded
  std::vector<Argument> args;            // what this rank passes to execute()
  Mutation mutation = Mutation::None;
};

class FusionFuzzer {
 public:
  FusionFuzzer(uint64_t seed, int64_t world_size, int64_t rank) : gen_(seed), n_(world_size), rank_(rank) {}

  Mutation mutation() const { return case_.mutation; }
  const FuzzCase& current() const { return case_; }

  // Builds the case; a mutation may make the definition itself throw UserError (then mutation()
  // tells which, and current().fusion holds the part built so far).
  FuzzCase& make() {
    std::vector<Mutation> all;
    for (int m = 1; m <= static_cast<int>(Mutation::MeshBeyondWorld); ++m) all.push_back(static_cast<Mutation>(m));
    if (chance(0.25)) case_.mutation = all[pick(all.size())];
    multi_ = chance(0.7) || case_.mutation == Mutation::UnevenShard || case_.mutation == Mutation::MismatchedSplit ||
             case_.mutation == Mutation::BadAxis || case_.mutation == Mutation::MeshBeyondWorld;
    const int inputs = 1 + static_cast<int>(pick(2));
    for (int i = 0; i < inputs; ++i) newInput(randomShape(), randomDtype(), chance(0.2));
    const int steps = 1 + static_cast<int>(pick(5));
    for (int i = 0; i < steps; ++i) step();
    mutateDefinition();
    Fusion& f = *case_.fusion;
    f.addOutput(pool_.back().tv);
    if (pool_.size() > 2 && chance(0.3)) {
      const Node& extra = pool_[pick(pool_.size())];
      if (!f.isInput(extra.tv) && !f.isOutput(extra.tv)) f.addOutput(extra.tv);  // each output once
    }
    if (multi_) shardAll();
    bindArguments();
    return case_;
  }

 private:
  struct Node {
    TensorView* tv;
    std::vector<int64_t> shape;  // the actual global extents
  };

  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(gen_) < p; }
  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(gen_); }
  const Node& any() { return pool_[pick(pool_.size())]; }
  bool isFloat(DataType d) { return isFloatingPoint(d); }

  int64_t randomExtent() {
    // Multiples of the world size shard evenly; the rest exercise broadcasting and uneven splits.
    const int64_t choices[] = {1, n_, 2 * n_, 3, 2};
    return choices[pick(5)];
  }
  std::vector<int64_t> randomShape() {
    std::vector<int64_t> s(1 + pick(3));
    for (int64_t& e : s) e = randomExtent();
    return s;
  }
  DataType randomDtype() {
    const DataType d[] = {DataType::Float, DataType::Float, DataType::Float, DataType::Double,  DataType::Double,
                          DataType::Int,   DataType::Int32, DataType::Half,  DataType::BFloat16};
    return d[pick(9)];
  }

  // A new fusion input of global `shape`, with random data exactly representable in every dtype.
  TensorView* newInput(const std::vector<int64_t>& shape, DataType dtype, bool symbolic,
                       std::vector<int64_t> defined = {}) {
    if (defined.empty()) {
      defined = shape;
      if (symbolic)
        for (int64_t& e : defined) e = chance(0.5) ? -1 : e;
    }
    TensorView* tv = case_.fusion->newTensor(dtype, defined);
    case_.fusion->addInput(tv);
    RefTensor data{shape, std::vector<double>(static_cast<size_t>(numelOf(shape)))};
    for (double& v : data.data)
      v = isFloat(dtype) ? static_cast<double>(static_cast<int>(pick(17)) - 8) / 4 : static_cast<double>(pick(7)) - 3;
    case_.global_inputs.push_back(data);
    pool_.push_back({tv, shape});
    return tv;
  }

  static bool broadcasts(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    for (size_t i = 1; i <= std::min(a.size(), b.size()); ++i) {
      int64_t x = a[a.size() - i], y = b[b.size() - i];
      if (x != y && x != 1 && y != 1) return false;
    }
    return true;
  }
  static std::vector<int64_t> broadcastShape(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    std::vector<int64_t> out(std::max(a.size(), b.size()), 1);
    for (const auto* s : {&a, &b})
      for (size_t d = 0; d < s->size(); ++d) {
        int64_t& o = out[out.size() - s->size() + d];
        o = std::max(o, (*s)[d]);
      }
    return out;
  }

  void push(TensorView* tv, std::vector<int64_t> shape) { pool_.push_back({tv, std::move(shape)}); }

  // The ops a step draws from. To add an op, write an emitter (it appends the op to an operand
  // and pushes the result with its global shape; it may make new inputs), add a row (its relative
  // weight and, when it does not take every operand, the condition on the operand), and teach
  // ReferenceEvaluator (fuzz_reference.h) the op.
  using Emit = void (FusionFuzzer::*)(const Node&);
  struct OpGen {
    const char* name;
    double weight;
    bool (*applies)(const Node&);  // null: any operand
    Emit emit;
  };
  static const std::vector<OpGen>& opTable() {
    static const std::vector<OpGen> table = {
        {"unary", 0.25, nullptr, &FusionFuzzer::emitUnary},
        {"binary", 0.30, nullptr, &FusionFuzzer::emitBinary},
        {"cast", 0.08, nullptr, &FusionFuzzer::emitCast},
        {"reduction", 0.12, nullptr, &FusionFuzzer::emitReduction},
        {"broadcast_in_dim", 0.08, [](const Node& a) { return a.shape.size() < 3; }, &FusionFuzzer::emitBroadcastInDim},
        {"permute", 0.08, [](const Node& a) { return a.shape.size() >= 2; }, &FusionFuzzer::emitPermute},
        {"reshape", 0.04, nullptr, &FusionFuzzer::emitReshape},
        {"linear", 0.05, [](const Node& a) { return a.shape.size() == 2 && isFloatingPoint(a.tv->dtype()); },
         &FusionFuzzer::emitLinear},
        {"issue 12 ops", 0.30, nullptr, &FusionFuzzer::emitNewOp},
    };
    return table;
  }

  // One random valid op appended to the fusion: a row of opTable() that takes a random operand,
  // drawn by weight.
  void step() {
    const Node a = any();
    std::vector<const OpGen*> usable;
    std::vector<double> weights;
    for (const OpGen& op : opTable())
      if (op.applies == nullptr || op.applies(a)) {
        usable.push_back(&op);
        weights.push_back(op.weight);
      }
    const size_t k = std::discrete_distribution<size_t>(weights.begin(), weights.end())(gen_);
    (this->*usable[k]->emit)(a);
  }

  // Comparisons, where, the new unary ops, slice, cat and normalization chains (newOpStep); a plain
  // unary op where the drawn one does not suit the operand.
  void emitNewOp(const Node& a) {
    if (!newOpStep(a)) emitUnary(a);
  }

  void emitUnary(const Node& a) {
    const OpType ops[] = {OpType::Neg, OpType::Abs, OpType::Relu, OpType::Sigmoid, OpType::Tanh};
    push(ops::unary(ops[pick(5)], a.tv), a.shape);
  }

  void emitBinary(const Node& a) {
    const OpType ops[] = {OpType::Add, OpType::Sub, OpType::Mul, OpType::Max, OpType::Min};
    const OpType op = ops[pick(5)];
    if (chance(0.2)) {  // an integral constant, exact in every dtype
      push(ops::binary(op, a.tv, case_.fusion->newScalar(DataType::Double, static_cast<double>(pick(5)) - 2)), a.shape);
      return;
    }
    for (int tries = 0; tries < 8; ++tries) {
      const Node b = any();
      if (broadcasts(a.shape, b.shape)) {
        push(ops::binary(op, a.tv, b.tv), broadcastShape(a.shape, b.shape));
        return;
      }
    }
    std::vector<int64_t> b_shape = a.shape;  // a compatible new input: some extents become 1
    for (int64_t& e : b_shape) e = chance(0.3) ? 1 : e;
    if (b_shape.size() > 1 && chance(0.3)) b_shape.erase(b_shape.begin());
    TensorView* b = newInput(b_shape, randomDtype(), chance(0.2));
    const bool swap = chance(0.5);  // either order; the result has a's shape as b broadcasts to it
    push(ops::binary(op, swap ? b : a.tv, swap ? a.tv : b), a.shape);
  }

  void emitCast(const Node& a) {
    const DataType to[] = {DataType::Float, DataType::Double, DataType::Half, DataType::BFloat16};
    push(ops::cast(a.tv, to[pick(4)]), a.shape);
  }

  void emitReduction(const Node& a) {
    const int64_t rank = static_cast<int64_t>(a.shape.size());
    int64_t axis = static_cast<int64_t>(pick(a.shape.size()));
    bool keepdim = chance(0.5);
    std::vector<int64_t> shape;
    for (int64_t d = 0; d < rank; ++d)
      if (d != axis)
        shape.push_back(a.shape[d]);
      else if (keepdim)
        shape.push_back(1);
    if (shape.empty()) keepdim = true, shape = {1};  // keep results at rank >= 1
    push(ops::reduction(chance(0.6) ? OpType::Sum : OpType::ReduceMax, a.tv, {chance(0.3) ? axis - rank : axis},
                        keepdim),
         shape);
  }

  void emitBroadcastInDim(const Node& a) {
    const int64_t rank = static_cast<int64_t>(a.shape.size());
    const int64_t at = static_cast<int64_t>(pick(a.shape.size() + 1));
    std::vector<int64_t> shape = a.shape, dims;
    shape.insert(shape.begin() + at, randomExtent());
    for (int64_t d = 0; d <= rank; ++d)
      if (d != at) dims.push_back(d);
    for (size_t i = 0; i < a.shape.size(); ++i)  // size-1 axes may also expand
      if (a.shape[i] == 1 && chance(0.3)) shape[static_cast<size_t>(dims[i])] = randomExtent();
    push(ops::broadcastInDim(a.tv, shape, dims), shape);
  }

  void emitPermute(const Node& a) {
    std::vector<int64_t> perm(a.shape.size());
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), gen_);
    std::vector<int64_t> shape;
    for (int64_t d : perm) shape.push_back(a.shape[static_cast<size_t>(d)]);
    push(ops::permute(a.tv, perm), shape);
  }

  void emitReshape(const Node& a) {
    const int64_t n = numelOf(a.shape);
    std::vector<int64_t> shape = n % 2 == 0 && chance(0.5) ? std::vector<int64_t>{2, n / 2} : std::vector<int64_t>{n};
    std::vector<int64_t> target = shape;
    if (chance(0.3)) target.back() = -1;
    push(ops::reshape(a.tv, target), shape);
  }

  void emitLinear(const Node& a) {
    const int64_t k = a.shape[1], out = randomExtent();
    TensorView* w = newInput({out, k}, a.tv->dtype(), false);
    push(ops::linear(a.tv, w), {a.shape[0], out});
  }

  // Issue 12's ops: comparisons and where, the new unary ops, slice and cat, and normalization
  // chains (var_mean, softmax, outer sums) that lower to normalization segments mixed with the
  // pointwise ops around them. False when `a` does not suit the op drawn.
  bool newOpStep(const Node& a) {
    const int64_t rank = static_cast<int64_t>(a.shape.size());
    const bool is_float = isFloat(a.tv->dtype());
    Fusion& f = *case_.fusion;
    auto number = [&](double v) { return f.newScalar(DataType::Double, v); };
    switch (pick(7)) {
      case 0: {  // where(cmp(input, input or number), a, b or number): compared values are inputs, exact in
                 // every dtype, so the reference takes the same branch
        std::vector<Node> inputs;
        for (const Node& n : pool_)
          if (f.isInput(n.tv) && n.tv->dtype() != DataType::Bool && broadcasts(n.shape, a.shape)) inputs.push_back(n);
        if (inputs.empty()) return false;
        const Node c = inputs[pick(inputs.size())];
        const OpType cmps[] = {OpType::Lt, OpType::Le, OpType::Gt, OpType::Ge, OpType::Eq, OpType::Ne};
        const OpType cmp = cmps[pick(6)];
        const Node d = inputs[pick(inputs.size())];
        const bool with_tensor = chance(0.5) && broadcasts(d.shape, c.shape);
        TensorView* cond = ops::binary(
            cmp, c.tv, with_tensor ? static_cast<Val*>(d.tv) : number(0.25 * (static_cast<double>(pick(9)) - 4)));
        const std::vector<int64_t> cond_shape = with_tensor ? broadcastShape(c.shape, d.shape) : c.shape;
        if (chance(0.3)) cond = ops::unary(OpType::LogicalNot, cond);
        if (chance(0.3))
          cond = ops::binary(chance(0.5) ? OpType::LogicalAnd : OpType::LogicalOr, cond,
                             ops::binary(OpType::Ne, c.tv, number(0)));
        if (!broadcasts(cond_shape, a.shape)) return false;
        Val* other = number(static_cast<double>(pick(5)) - 2);
        std::vector<int64_t> shape = broadcastShape(cond_shape, a.shape);
        for (int tries = 0; tries < 4; ++tries) {
          const Node b = any();
          if (b.tv->dtype() != DataType::Bool && broadcasts(shape, b.shape)) {
            other = b.tv;
            shape = broadcastShape(shape, b.shape);
            break;
          }
        }
        const bool swap = chance(0.5);
        push(ops::where(cond, swap ? other : a.tv, swap ? a.tv : other), shape);
        return true;
      }
      case 1: {  // the new unary ops, on a float, their operand kept away from poles
        if (!is_float) return false;
        const OpType safe[] = {OpType::Square, OpType::Erf, OpType::Silu};
        if (chance(0.5)) {
          push(ops::unary(safe[pick(3)], a.tv), a.shape);
          return true;
        }
        TensorView* positive = ops::binary(OpType::Add, ops::unary(OpType::Abs, a.tv), number(1));
        push(ops::unary(chance(0.5) ? OpType::Rsqrt : OpType::Reciprocal, positive), a.shape);
        return true;
      }
      case 2: {  // slice of one axis
        if (rank == 0) return false;
        const int64_t axis = static_cast<int64_t>(pick(a.shape.size()));
        const int64_t extent = a.shape[axis];
        std::vector<int64_t> starts(rank, 0), ends = a.shape, steps(rank, 1);
        starts[axis] = static_cast<int64_t>(pick(static_cast<size_t>(extent)));
        ends[axis] = starts[axis] + 1 + static_cast<int64_t>(pick(static_cast<size_t>(extent - starts[axis])));
        steps[axis] = 1 + static_cast<int64_t>(pick(2));
        if (a.tv->shape()[axis] < 0) return false;  // a symbolic extent: the end may not be checked
        std::vector<int64_t> shape = a.shape;
        shape[axis] = (ends[axis] - starts[axis] + steps[axis] - 1) / steps[axis];
        push(ops::slice(a.tv, starts, ends, steps), shape);
        return true;
      }
      case 3: {  // cat with another value of the same dtype and extents but along one axis
        if (rank == 0) return false;
        const int64_t axis = static_cast<int64_t>(pick(a.shape.size()));
        for (const Node& b : pool_) {
          if (b.tv == a.tv || b.tv->dtype() != a.tv->dtype() || b.shape.size() != a.shape.size()) continue;
          bool fits = true;
          for (int64_t d = 0; d < rank; ++d) fits = fits && (d == axis || b.shape[d] == a.shape[d]);
          if (!fits) continue;
          std::vector<int64_t> shape = a.shape;
          shape[axis] += b.shape[axis];
          push(ops::cat({a.tv, b.tv}, axis), shape);
          return true;
        }
        std::vector<int64_t> shape = a.shape;
        shape[axis] *= 2;
        push(ops::cat({a.tv, a.tv}, axis), shape);
        return true;
      }
      case 4: {  // LayerNorm-like: var_mean over the last (inner) or the first (outer) axes
        if (!is_float || rank == 0) return false;
        const bool inner = chance(0.6);
        const int64_t axes = rank > 1 && chance(0.3) ? 2 : 1;
        std::vector<int64_t> dims;
        for (int64_t i = 0; i < axes; ++i) dims.push_back(inner ? rank - axes + i : i);
        int64_t count = 1;
        for (int64_t d : dims) count *= a.shape[d];
        const int64_t correction = count > 1 && chance(0.3) ? 1 : 0;
        auto [var, mean] = ops::varMean(a.tv, dims, correction, true);
        TensorView* rstd = ops::unary(OpType::Rsqrt, ops::binary(OpType::Add, var, number(1)));
        TensorView* y = ops::binary(OpType::Mul, ops::binary(OpType::Sub, a.tv, mean), rstd);
        push(chance(0.5) ? y : ops::binary(OpType::Add, ops::binary(OpType::Mul, y, number(2)), number(1)), a.shape);
        return true;
      }
      case 5: {  // softmax or RMSNorm over the last axis
        if (!is_float || rank == 0) return false;
        const int64_t last = rank - 1;
        if (chance(0.5)) {
          TensorView* e = ops::unary(
              OpType::Exp, ops::binary(OpType::Sub, a.tv, ops::reduction(OpType::ReduceMax, a.tv, {last}, true)));
          push(ops::binary(OpType::Div, e, ops::reduction(OpType::Sum, e, {last}, true)), a.shape);
        } else {
          TensorView* ms = ops::reduction(OpType::Mean, ops::unary(OpType::Square, a.tv), {last}, true);
          push(ops::binary(OpType::Mul, a.tv, ops::unary(OpType::Rsqrt, ops::binary(OpType::Add, ms, number(1)))),
               a.shape);
        }
        return true;
      }
      default: {  // an outer reduction of a pointwise product (a weight gradient), and a consumer
        if (!is_float || rank < 2) return false;
        TensorView* prod = ops::binary(OpType::Mul, a.tv, ops::unary(OpType::Silu, a.tv));
        std::vector<int64_t> shape(a.shape.begin() + 1, a.shape.end());
        TensorView* r = ops::reduction(chance(0.5) ? OpType::Mean : OpType::Sum, prod, {0}, false);
        push(chance(0.5) ? r : ops::binary(OpType::Mul, r, number(3)), shape);
        return true;
      }
    }
  }

  // Mutations of the definition; each must raise UserError (at definition or at execute).
  void mutateDefinition() {
    const Node a = pool_.back();
    const int64_t rank = static_cast<int64_t>(a.shape.size());
    switch (case_.mutation) {
      case Mutation::NonBroadcastingBinary: {
        TensorView* x = newInput({3, 2}, DataType::Float, false);
        TensorView* y = newInput({2, 2}, DataType::Float, false);
        push(ops::binary(OpType::Add, x, y), {3, 2});
        break;
      }
      case Mutation::SymbolicMismatch: {  // {-1, 2} and {-1, 2} agree at definition; 3 vs 2 at execute
        TensorView* x = newInput({3, 2}, DataType::Float, false, std::vector<int64_t>{-1, 2});
        TensorView* y = newInput({2, 2}, DataType::Float, false, std::vector<int64_t>{-1, 2});
        push(ops::binary(OpType::Mul, x, y), {3, 2});
        break;
      }
      case Mutation::BadReductionAxis:
        push(ops::reduction(OpType::Sum, a.tv, {chance(0.5) ? rank : -rank - 1}, false), a.shape);
        break;
      case Mutation::BadPermutation: {
        std::vector<int64_t> perm(static_cast<size_t>(rank), 0);  // duplicates (or, for rank 1, too long)
        if (rank == 1) perm = {0, 0};
        push(ops::permute(a.tv, perm), a.shape);
        break;
      }
      case Mutation::LinearMismatchedK: {
        TensorView* x = newInput({2, 3}, DataType::Float, false);
        TensorView* w = newInput({4, 2}, DataType::Float, false);
        push(ops::linear(x, w), {2, 4});
        break;
      }
      default: break;  // the others act on shardings or arguments
    }
  }

  std::vector<int64_t> worldDevices() const {
    std::vector<int64_t> d(static_cast<size_t>(n_));
    std::iota(d.begin(), d.end(), 0);
    return d;
  }

  // Every tensor on the world mesh; the sharding mutation (on a tensor that is surely checked: an
  // input or the last output) first, then random even shardings of other tensors.
  void shardAll() {
    const DeviceMesh world(worldDevices());
    for (const auto& v : case_.fusion->vals())
      if (v->isTensor()) static_cast<TensorView*>(v.get())->setDeviceMesh(world);
    std::vector<size_t> live;
    for (size_t i = 0; i < pool_.size(); ++i)
      if (case_.fusion->isInput(pool_[i].tv) || i + 1 == pool_.size()) live.push_back(i);
    Node& victim = pool_[live[pick(live.size())]];
    const int64_t victim_rank = static_cast<int64_t>(victim.shape.size());
    switch (case_.mutation) {
      case Mutation::UnevenShard: {  // an extent the parts do not divide (for n == 1: 2 parts)
        const int64_t parts = n_ == 1 ? 2 : n_;
        std::vector<int64_t> uneven;
        for (int64_t d = 0; d < victim_rank; ++d)  // a symbolic input extent would just bind larger
          if (victim.shape[d] % parts != 0 && victim.tv->shape()[d] >= 0) uneven.push_back(d);
        if (uneven.empty())
          shard(victim.tv, 0, n_ + 1);  // no such axis: more parts than devices instead
        else
          shard(victim.tv, uneven[pick(uneven.size())], parts);
        break;
      }
      case Mutation::MismatchedSplit:
        shard(victim.tv, static_cast<int64_t>(pick(victim.shape.size())), 2 * n_ + 1);
        break;
      case Mutation::BadAxis: {
        const int64_t bad = static_cast<int64_t>(victim.tv->loop().size()) + static_cast<int64_t>(pick(2));
        if (chance(0.5))
          victim.tv->outerSplit(bad, n_);
        else
          victim.tv->parallelize(bad, ParallelType::MeshX);
        break;
      }
      case Mutation::MeshBeyondWorld: {
        std::vector<int64_t> devices = worldDevices();
        devices.back() = n_;  // names device n: one past the world
        victim.tv->setDeviceMesh(DeviceMesh(devices));
        break;
      }
      default: break;
    }
    for (Node& node : pool_) {
      if (!chance(0.35)) continue;
      std::vector<int64_t> even;
      for (size_t d = 0; d < node.shape.size(); ++d)
        if (node.shape[d] % n_ == 0 && linesUpWithView(node, static_cast<int64_t>(d)))
          even.push_back(static_cast<int64_t>(d));
      if (!even.empty()) shard(node.tv, even[pick(even.size())], n_);
    }
  }

  // Whether a view's result may be sharded on `axis`: where its input is sharded, only on the axis
  // the input's blocks land on (resharding rejects other annotations of a view's result rather
  // than gathering the input behind the user's back).
  bool linesUpWithView(const Node& node, int64_t axis) const {
    const Expr* def = node.tv->definition();
    if (def == nullptr || def->op() != OpType::Reshape || n_ == 1) return true;
    const TensorView* in = def->inputTv(0);
    const int a = in->shardedAxis(ParallelType::MeshX);
    if (a < 0) return true;
    const auto in_node = std::find_if(pool_.begin(), pool_.end(), [&](const Node& m) { return m.tv == in; });
    const std::vector<int> map = inputToOutputAxes(def, 0);
    return map[static_cast<size_t>(a)] == axis && in_node != pool_.end() &&
           in_node->shape[static_cast<size_t>(a)] % n_ == 0;
  }

  // Splits logical axis `axis` (a whole loop axis) into `parts` and parallelizes it on mesh_x;
  // a no-op when the tensor is already sharded.
  static void shard(TensorView* tv, int64_t axis, int64_t parts) {
    if (tv->isSharded()) return;
    int64_t loop_axis = -1;
    for (size_t i = 0; i < tv->loop().size(); ++i)
      if (tv->loop()[i].logical == axis) loop_axis = static_cast<int64_t>(i);
    if (loop_axis < 0) return;
    tv->outerSplit(loop_axis, parts);
    tv->parallelize(loop_axis, ParallelType::MeshX);
  }

  // This rank's arguments: each input's shard (block of the mesh_x axis), with argument mutations.
  void bindArguments() {
    const Fusion& f = *case_.fusion;
    for (size_t i = 0; i < f.inputs().size(); ++i) {
      auto* tv = static_cast<TensorView*>(f.inputs()[i]);
      const RefTensor& g = case_.global_inputs[i];
      Tensor full = Tensor::empty(g.shape, DataType::Double);
      std::copy(g.data.begin(), g.data.end(), full.dataAs<double>());
      Tensor local = full;
      const int axis = tv->shardedAxis(ParallelType::MeshX);
      if (axis >= 0 && tv->hasDeviceMesh() && tv->deviceMesh()->has(rank_)) {
        const int64_t parts = tv->partsAlong(ParallelType::MeshX, g.shape[axis]);
        if (parts > 0 && g.shape[axis] % parts == 0) {
          const int64_t chunk = g.shape[axis] / parts;
          local = full.slice(axis, tv->deviceMesh()->indexOf(rank_) % parts * chunk, chunk).clone();
        }
      }
      case_.args.push_back(local.to(tv->dtype()));
    }
    if (f.inputs().empty()) return;
    const size_t victim = pick(f.inputs().size());
    Tensor& t = std::get<Tensor>(case_.args[victim]);
    const auto& defined = static_cast<const TensorView*>(f.inputs()[victim])->shape();
    std::vector<size_t> fixed;  // a symbolic extent would simply take a wrong value
    for (size_t d = 0; d < defined.size(); ++d)
      if (defined[d] >= 0) fixed.push_back(d);
    if (case_.mutation == Mutation::WrongInputExtent && fixed.empty()) case_.mutation = Mutation::WrongInputDtype;
    switch (case_.mutation) {
      case Mutation::WrongInputExtent: {
        std::vector<int64_t> shape = t.shape();
        shape[fixed[pick(fixed.size())]] += 1;
        t = Tensor::zeros(shape, t.dtype());
        break;
      }
      case Mutation::WrongInputDtype:
        t = t.to(t.dtype() == DataType::Double ? DataType::Float : DataType::Double);
        break;
      case Mutation::WrongInputCount: case_.args.pop_back(); break;
      default: break;
    }
  }

  std::mt19937_64 gen_;
  int64_t n_, rank_;
  bool multi_ = false;
  FuzzCase case_;
  std::vector<Node> pool_;
};

}  // namespace meshfuse::testing

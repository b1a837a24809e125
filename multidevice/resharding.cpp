#include "multidevice/resharding.h"

#include <algorithm>
#include <map>
#include <set>

#include "multidevice/axis_map.h"
#include "ops/attention.h"
#include "ops/ops.h"
#include "runtime/tensor.h"

namespace meshfuse {

bool isMultiDevice(const Fusion& fusion) {
  for (const auto& v : fusion.vals())
    if (v->isTensor() && static_cast<const TensorView*>(v.get())->hasDeviceMesh()) return true;
  return false;
}

bool isResharding(const Expr* e) {
  if (e->op() != OpType::Set) return false;
  const TensorView* in = e->inputTv(0);
  const TensorView* out = e->out();
  return in->deviceMesh() != out->deviceMesh() || !(shardingOf(in) == shardingOf(out));
}

namespace {

std::string describe(const TensorView* tv) {
  return tv->name() + " (" + (tv->hasDeviceMesh() ? tv->deviceMesh()->toString() : std::string("no mesh")) + ", " +
         shardingOf(tv).toString() + ")";
}

bool axesDistinct(const Sharding& s) {
  for (int i = 0; i < kMeshDims; ++i)
    for (int j = i + 1; j < kMeshDims; ++j)
      if (s.axis[i] >= 0 && s.axis[i] == s.axis[j]) return false;
  return true;
}

class ReshardingPass {
 public:
  ReshardingPass(const Fusion& original, const BoundShapes& bound, const ReshardingOptions& options)
      : original_(original), bound_(bound), options_(options), out_(std::make_unique<Fusion>()) {
    map_.assign(original.vals().size(), nullptr);
    for (const auto& v : original.vals()) {
      if (!v->isTensor()) continue;
      auto* tv = static_cast<const TensorView*>(v.get());
      if (tv->hasDeviceMesh() && !default_mesh_) default_mesh_ = *tv->deviceMesh();
    }
  }

  ReshardedFusion run() {
    for (Val* in : original_.inputs()) {
      Val* n = copyVal(in);
      map_[in->id()] = n;
      out_->addInput(n);
    }
    // Constant scalars are not inputs: copy them on first use.
    for (Expr* e : original_.liveExprs()) lowerExpr(e);
    std::set<const Val*> added;
    for (Val* o : original_.outputs()) {
      if (map_[o->id()] == nullptr) map_[o->id()] = map_.at(o->id());  // an input used as output
      Val* v = map_[o->id()];
      // Two outputs the user made distinct (y = set(x), z = set(x)) that need the same resharding share
      // its one result (reshard's cache): the second gets a copy of its own, as without resharding.
      if (!added.insert(v).second && v->isTensor()) v = copyOf(static_cast<TensorView*>(v));
      out_->addOutput(v);
    }
    return {std::move(out_), std::move(map_)};
  }

 private:
  Val* copyVal(const Val* v) {
    if (!v->isTensor()) return out_->newScalar(v->dtype(), static_cast<const Scalar*>(v)->value());
    auto* tv = static_cast<const TensorView*>(v);
    TensorView* n = out_->newTensor(tv->dtype(), tv->shape(), tv->contiguity());
    if (tv->hasDeviceMesh())
      n->setDeviceMesh(*tv->deviceMesh());
    else if (default_mesh_)
      n->setDeviceMesh(*default_mesh_);  // unannotated inputs: replicated on the mesh
    n->setLoop(tv->loop());
    return n;
  }

  Val* mapped(Val* v) {
    if (map_[v->id()] == nullptr) {
      if (v->isTensor()) throw std::logic_error("resharding: " + v->name() + " used before it is defined");
      map_[v->id()] = copyVal(v);
    }
    return map_[v->id()];
  }

  // The output sharding implied by the inputs along each dim (Partial where a sharded axis is reduced).
  // Where inputs are sharded along one mesh dimension on different output axes, the first in
  // `order` decides: for matmul and linear the weight (operand 1), so that a sequence-parallel
  // activation is gathered rather than the weight (Megatron's SP), else operand order.
  Sharding propagate(const Expr* e, const std::vector<Val*>& inputs, const DeviceMesh& mesh) {
    Sharding s;
    std::vector<size_t> order(inputs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    const bool contraction = (e->op() == OpType::Linear || e->op() == OpType::Matmul) && order.size() >= 2;
    if (contraction) std::swap(order[0], order[1]);
    std::array<size_t, kMeshDims> partial_from{};  // the operand whose reduced axis made dim d Partial
    for (int d = 0; d < std::min<int64_t>(mesh.rank(), kMeshDims); ++d) {
      for (size_t i : order) {
        if (!inputs[i]->isTensor()) continue;
        auto* tv = static_cast<TensorView*>(inputs[i]);
        if (tv->deviceMesh() != mesh) continue;
        if (passesPartial(e->op()) && shardingOf(tv).partial[d]) {
          s.partial[d] = true;  // reduced after the view, where its result's sharding is known
          break;
        }
        int a = shardingOf(tv).axis[d];
        if (a < 0) continue;
        int b = inputToOutputAxes(e, i)[a];
        if (b == kReducedAxis) {
          s.partial[d] = true;
          partial_from[d] = i;
        } else if (b >= 0 && s.axis[d] < 0 && std::find(s.axis.begin(), s.axis.end(), b) == s.axis.end()) {
          s.axis[d] = b;
        }
        break;
      }
      if (s.partial[d]) s.axis[d] = -1;
    }
    if (contraction) keepOnePartialDim(s, partial_from, order[0]);
    return s;
  }

  // A matmul's operands share one contraction axis, which a tensor shards along one mesh dimension at
  // most: Partial along two dims (a's K sharded on mesh_x, b's on mesh_y) would need both operands
  // sharded along both. One dim stays Partial, the weight's where it shards K (as propagate prefers
  // the weight), else the first; the operand sharded along the other is gathered there and sliced.
  static void keepOnePartialDim(Sharding& s, const std::array<size_t, kMeshDims>& partial_from, size_t weight) {
    int keep = -1;
    for (int d = 0; d < kMeshDims; ++d)
      if (s.partial[d] && (keep < 0 || (partial_from[d] == weight && partial_from[keep] != weight))) keep = d;
    for (int d = 0; d < kMeshDims; ++d)
      if (d != keep) s.partial[d] = false;
  }

  TensorView* newTv(const TensorView* like_shape, DataType dtype, const DeviceMesh& mesh, const Sharding& s) {
    TensorView* tv = out_->newTensor(dtype, like_shape->shape());
    applySharding(tv, mesh, s);
    return tv;
  }

  // A copy of `tv` with its mesh and sharding (a set that moves nothing: a pointwise copy).
  TensorView* copyOf(TensorView* tv) {
    if (tv->hasDeviceMesh()) return emitSet(tv, *tv->deviceMesh(), shardingOf(tv));
    TensorView* copy = out_->newTensor(tv->dtype(), tv->shape(), tv->contiguity());
    out_->newExpr(OpType::Set, {tv}, {copy});
    return copy;
  }

  // One set from `in` to a tensor on `mesh` with sharding `s` (a single change), of `dtype` where
  // given (a set that changes only the dtype does not round inside a fused kernel).
  TensorView* emitSet(TensorView* in, const DeviceMesh& mesh, const Sharding& s,
                      std::optional<DataType> dtype = std::nullopt) {
    TensorView* out = newTv(in, dtype.value_or(in->dtype()), mesh, s);
    out_->newExpr(OpType::Set, {in}, {out});
    return out;
  }

  // Moves `tv` to another mesh: Gather/Reduce to one device, Broadcast/Scatter from one device,
  // SendRecv between meshes of one shape.
  TensorView* crossMesh(TensorView* tv, const DeviceMesh& mesh, const Sharding& target) {
    const DeviceMesh& src = *tv->deviceMesh();
    Sharding s = shardingOf(tv);
    if (src.shape() == mesh.shape()) {
      // What makes the data smaller happens on the source, before the send: a Partial dim is reduced
      // (a reduce-scatter where the target shards that dim), a replicated dim the target shards is
      // sliced. What makes it larger (a gather) is left to the destination, after the smaller send.
      // (Sending a replicated tensor whole and slicing it there moved d times the data.)
      Sharding before = s;
      for (int d = 0; d < kMeshDims; ++d) {
        if (s.partial[d]) {
          before.partial[d] = false;
          before.axis[d] = target.axis[d];
        } else if (s.axis[d] < 0) {
          before.axis[d] = target.axis[d];
        }
      }
      if (!axesDistinct(before)) {  // an axis would be sharded twice: reduce only, as a plain move
        before = s;
        before.partial = {false, false, false};
      }
      if (!(before == s)) tv = reshardSameMesh(tv, before);
      return emitSet(tv, mesh, before);  // SendRecv, device i of one mesh to device i of the other
    }
    if (mesh.size() == 1) {
      // Gather / Reduce onto a device of a 1-D source mesh, or a one-device copy. A root outside the
      // source mesh, or a mesh of more dims, gets the tensor made whole on the source first (an
      // allgather or allreduce), then sent (a SendRecv) or kept (the root is a member).
      const bool blocks = s.isPartial() || s.axis[0] >= 0 || s.axis[1] >= 0 || s.axis[2] >= 0;
      if (blocks && (src.rank() != 1 || !src.has(mesh.devices()[0]))) tv = reshardSameMesh(tv, Sharding{});
      return emitSet(tv, mesh, Sharding{});
    }
    if (src.size() == 1) {
      // Broadcast (replicate) or Scatter (shard) onto a 1-D mesh. A scatter whose root is not in the
      // target mesh, or any move onto a mesh of more dims, broadcasts the whole tensor; each device
      // then keeps its block (reshard's local slices after this).
      const bool root_inside = mesh.has(src.devices()[0]);
      if (mesh.rank() != 1 || (!root_inside && target.axis[0] >= 0)) return emitSet(tv, mesh, Sharding{});
      Sharding t;
      t.axis[0] = target.axis[0];
      return emitSet(tv, mesh, t);
    }
    throw UserError("cannot move " + describe(tv) + " onto " + mesh.toString() +
                    ": meshes differ in shape and neither is a single device");
  }

  // The transition of one mesh dim from `cur` towards `target`, one communication each.
  TensorView* reshardSameMesh(TensorView* tv, const Sharding& target) {
    const DeviceMesh mesh = *tv->deviceMesh();
    Sharding cur = shardingOf(tv);
    // Partial along several mesh dims, wanted replicated along them: one allreduce over the team
    // those dims span (a sum over both sharded axes of a [dp, tp] mesh), not one per dim.
    Sharding merged = cur;
    int resolved_dims = 0;
    for (int d = 0; d < kMeshDims; ++d) {
      if (cur.partial[d] && !target.partial[d] && target.axis[d] < 0) {
        merged.partial[d] = false;
        ++resolved_dims;
      }
    }
    if (resolved_dims > 1) {
      tv = emitSet(tv, mesh, merged);
      cur = merged;
    }
    for (int guard = 0; !(cur == target) && guard < 3 * kMeshDims; ++guard) {
      int chosen = -1;
      Sharding next;
      for (int d = 0; d < kMeshDims && chosen < 0; ++d) {
        if (cur.axis[d] == target.axis[d] && cur.partial[d] == target.partial[d]) continue;
        if (target.partial[d])
          throw UserError("cannot make " + describe(tv) + " Partial along " + toString(meshParallelType(d)));
        Sharding candidate = cur;
        candidate.axis[d] = target.axis[d];
        candidate.partial[d] = false;
        if (axesDistinct(candidate)) {
          chosen = d;
          next = candidate;
        }
      }
      if (chosen < 0) {  // every direct step would shard one axis twice: gather one dim first
        for (int d = 0; d < kMeshDims && chosen < 0; ++d) {
          if (cur.axis[d] >= 0 && cur.axis[d] != target.axis[d]) {
            chosen = d;
            next = cur;
            next.axis[d] = -1;
          }
        }
      }
      if (chosen < 0) throw std::logic_error("resharding made no progress for " + describe(tv));
      tv = emitSet(tv, mesh, next);
      cur = next;
    }
    return tv;
  }

  TensorView* reshard(TensorView* tv, const DeviceMesh& mesh, const Sharding& target) {
    auto key = std::make_tuple(tv, mesh.devices(), mesh.shape(), target.axis, target.partial);
    if (auto it = reshard_cache_.find(key); it != reshard_cache_.end()) return it->second;
    TensorView* result = tv;
    if (tv->deviceMesh() != mesh) result = crossMesh(result, mesh, target);
    if (!(shardingOf(result) == target)) result = reshardSameMesh(result, target);
    reshard_cache_[key] = result;
    return result;
  }

  // The extent of axis `a` of `v` (a tensor of the original fusion, or of a scratch expr): bound at
  // execute where known, since a symbolic extent may bind to 1 and broadcast; else as defined.
  int64_t extentOf(const Val* v, int a) const {
    if (auto it = bound_.find(v); it != bound_.end()) return it->second[static_cast<size_t>(a)];
    return static_cast<const TensorView*>(v)->shape()[static_cast<size_t>(a)];
  }

  // A Partial result may stay unreduced when every use is a view that passes Partial on, or a
  // user's set, up to a tensor the user annotated: its resharding then does the reduction, and its
  // sharding decides between an allreduce and a reduce-scatter. Not for fusion outputs.
  bool partialCanWait(const TensorView* tv) const {
    if (original_.isOutput(tv) || tv->uses().empty()) return false;
    for (const Expr* use : tv->uses()) {
      const bool annotated = use->out()->hasDeviceMesh();
      if (!passesPartial(use->op()) && !(use->op() == OpType::Set && annotated)) return false;
      if (!annotated && !partialCanWait(use->out())) return false;
    }
    return true;
  }

  // Views whose Partial input gives a Partial result (the sum of the views is the view of the sum):
  // the reduction then happens after the view, where a sharded result makes it a reduce-scatter
  // (a GEMM's Partial [b*s, e] reshaped to [b, s, e] and wanted sharded on s).
  static bool passesPartial(OpType op) { return op == OpType::Reshape || op == OpType::Permute; }

  // The sharding input i must have for `e` to compute locally with output sharding `out`.
  Sharding requiredInput(const Expr* e, size_t i, const TensorView* in, const Sharding& out,
                         const Sharding& partial_src, const DeviceMesh& mesh) {
    Sharding r;
    std::vector<int> m = inputToOutputAxes(e, i);
    for (int d = 0; d < std::min<int64_t>(mesh.rank(), kMeshDims); ++d) {
      if (out.partial[d] && passesPartial(e->op()) && partial_src.partial[d]) {
        r.partial[d] = true;
        continue;
      }
      if (out.partial[d]) {
        // Keep the input's sharding on a reduced axis if it has one; else slice it there.
        int a = partial_src.axis[d];
        if (a < 0 || a >= static_cast<int>(m.size()) || m[a] != kReducedAxis) {
          a = -1;
          for (size_t k = 0; k < m.size(); ++k)
            if (m[k] == kReducedAxis) a = static_cast<int>(k);
        }
        if (a < 0)
          throw UserError(toString(e->op()) + ": operand " + in->name() +
                          " has no reduced axis to shard while the result is Partial");
        r.axis[d] = a;
        continue;
      }
      int b = out.axis[d];
      if (b < 0) continue;
      for (size_t a = 0; a < m.size(); ++a) {
        if (m[a] != b) continue;
        if (extentOf(e->inputs()[i], static_cast<int>(a)) == 1 && extentOf(e->out(), b) != 1)
          break;  // broadcast operand: replicated
        r.axis[d] = static_cast<int>(a);
      }
    }
    return r;
  }

  // A reshape keeps a mesh dimension on output axis b only where the blocks line up: b comes from
  // an input axis (the leading one) and both extents divide by that dimension's size. Elsewhere the
  // reshape runs on the whole (replicated) tensor and the result is sliced to its target after.
  Sharding reshapeComputeSharding(const Expr* e, Sharding compute, const DeviceMesh& mesh) const {
    for (int d = 0; d < std::min<int64_t>(mesh.rank(), kMeshDims); ++d) {
      const int b = compute.axis[d];
      if (b < 0) continue;
      const int64_t parts = mesh.size(meshParallelType(d));
      if (parts == 1) continue;  // one block: the whole tensor, whatever the axes
      const int a = inputAxisFor(e, 0, b);
      if (a < 0 || extentOf(e->inputs()[0], a) % parts != 0 || extentOf(e->out(), b) % parts != 0) compute.axis[d] = -1;
    }
    return compute;
  }

  // Slice and cat compute a sharded output axis locally only where an input axis maps onto it
  // whole; a sliced or concatenated axis is computed replicated and sliced to its target after.
  static Sharding unmappedAxesReplicated(const Expr* e, Sharding compute, const DeviceMesh& mesh) {
    for (int d = 0; d < std::min<int64_t>(mesh.rank(), kMeshDims); ++d) {
      const int b = compute.axis[d];
      if (b >= 0 && mesh.size(meshParallelType(d)) > 1 && inputAxisFor(e, 0, b) < 0) compute.axis[d] = -1;
    }
    return compute;
  }

  // An annotation on a view's result that its input's blocks cannot produce locally would need the
  // input gathered and the result sliced again: a user who sharded the input meant the view to stay
  // local, so say which axes do not line up instead of moving the data behind their back. (Where
  // the input is replicated along that mesh dimension, the slice is local and allowed.)
  static void checkViewAnnotationHonoured(const Expr* e, const std::vector<Val*>& inputs, const Sharding& wanted,
                                          const Sharding& local, const DeviceMesh& mesh) {
    for (int d = 0; d < std::min<int64_t>(mesh.rank(), kMeshDims); ++d) {
      if (wanted.axis[d] == local.axis[d]) continue;
      for (Val* v : inputs) {
        auto* tv = v->isTensor() ? static_cast<TensorView*>(v) : nullptr;
        if (tv == nullptr || tv->deviceMesh() != mesh || shardingOf(tv).axis[d] < 0) continue;
        const std::string p = toString(meshParallelType(d));
        throw UserError(toString(e->op()) + ": " + e->out()->name() + " " + shapeToString(e->out()->shape()) +
                        " is annotated sharded on axis " + std::to_string(wanted.axis[d]) + " along " + p + ", but " +
                        describe(tv) + " is sharded on axis " + std::to_string(shardingOf(tv).axis[d]) + " " +
                        shapeToString(tv->shape()) +
                        " and its blocks do not line up with that axis (a reshape keeps a sharding on the first axis "
                        "of a split or merge whose extent divides by the mesh size): annotate a sharding they line up "
                        "with, or reshard explicitly with a set()");
      }
    }
  }

  // Lowers one original expr (or a piece of one) whose output should end up as `target` on `mesh`.
  // Returns the value that holds the result with that sharding.
  TensorView* lowerCompute(const Expr* e, std::vector<Val*> inputs, const DeviceMesh& mesh,
                           std::optional<Sharding> target) {
    // Compute on the inputs' mesh when they all share one that differs from the output's: reduce
    // or move the (smaller) result, not the operands.
    std::optional<DeviceMesh> in_mesh;
    bool shared = true;
    for (Val* v : inputs) {
      if (!v->isTensor()) continue;
      const auto& m = static_cast<TensorView*>(v)->deviceMesh();
      if (!in_mesh)
        in_mesh = m;
      else if (m != in_mesh)
        shared = false;
    }
    DeviceMesh compute_mesh = (in_mesh && shared) ? *in_mesh : mesh;
    Sharding natural = propagate(e, inputs, compute_mesh);
    Sharding compute = natural;
    if (compute_mesh == mesh && target) {
      compute = *target;
      for (int d = 0; d < kMeshDims; ++d) {
        // A reduction over a sharded axis stays local (Partial) and is reduced afterwards.
        if (natural.partial[d]) {
          compute.partial[d] = true;
          compute.axis[d] = -1;
        }
      }
    }
    const Sharding wanted = compute;
    if (e->op() == OpType::Reshape) compute = reshapeComputeSharding(e, compute, compute_mesh);
    if (e->op() == OpType::Slice || e->op() == OpType::Cat) compute = unmappedAxesReplicated(e, compute, compute_mesh);
    // A slice or cat along the sharded axis reshards (issue 12 allows it: the cut or joined axis has
    // no block structure left); a reshape's annotation must line up with its input's blocks.
    if (target && e->op() == OpType::Reshape && !(compute == wanted))
      checkViewAnnotationHonoured(e, inputs, wanted, compute, compute_mesh);
    // ReshardingOptions::float_half_products says why. Not where the product is pipelined over
    // streams (docs/overlap.md's linear + reduce-scatter loop, built around a matmul whose result is
    // reduce-scattered as it is): those partials stay Half.
    const bool float_product = options_.float_half_products && compute.isPartial() &&
                               (e->op() == OpType::Matmul || e->op() == OpType::Linear) &&
                               e->out()->dtype() == DataType::Half && e->out()->streamAxis() < 0;
    // Linear with bias and a Partial result: add the bias once, after the reduction.
    if (e->op() == OpType::Linear && inputs.size() == 3 && compute.isPartial()) {
      Sharding resolved = target ? *target : Sharding{};
      if (!target)
        for (int d = 0; d < kMeshDims; ++d) resolved.axis[d] = compute.partial[d] ? -1 : compute.axis[d];
      TensorView* mm = lowerPiece(e, OpType::Linear, {inputs[0], inputs[1]}, compute_mesh, compute,
                                  float_product ? std::optional(DataType::Float) : std::nullopt);
      TensorView* reduced = reshard(mm, mesh, resolved);
      if (float_product) reduced = emitSet(reduced, *reduced->deviceMesh(), shardingOf(reduced), DataType::Half);
      TensorView* bias = static_cast<TensorView*>(inputs[2]);
      const Expr* add = biasAdd(reduced, bias);
      return lowerCompute(add, {reduced, bias}, mesh, resolved);
    }
    // A Half or BFloat16 sum or mean over a sharded axis: each rank's partial sum in float32, reduced
    // across ranks in float32 and rounded once after. Rounded before the allreduce, a LayerNorm's sum
    // of squares overflowed Half (inf variance, zero output) and its mean lost digits that the
    // unsharded fused kernel, which keeps float32, does not.
    const bool sixteen_bit_sum = (e->op() == OpType::Sum || e->op() == OpType::Mean) &&
                                 (e->out()->dtype() == DataType::Half || e->out()->dtype() == DataType::BFloat16);
    // A Partial result waits through views for the tensor that reshards it (a max's reduction op is
    // read back through them: partialOp). A 16-bit sum does not: it is widened instead.
    const bool waits =
        !sixteen_bit_sum && !float_product && compute_mesh == mesh && compute.isPartial() && partialCanWait(e->out());
    const bool widened = !waits && compute.isPartial() && (sixteen_bit_sum || float_product);
    TensorView* result =
        lowerPiece(e, e->op(), inputs, compute_mesh, compute, widened ? std::optional(DataType::Float) : std::nullopt);
    Sharding final_target = target.value_or(Sharding{});
    if (!target) {
      for (int d = 0; d < kMeshDims; ++d) final_target.axis[d] = compute.partial[d] ? -1 : compute.axis[d];
    }
    const bool waiting = waits && result->deviceMesh() == mesh && shardingOf(result).isPartial();
    // Shards are equal, so a mean is the average of the local means: their sum over the parts, / parts.
    // A waiting mean is scaled before it waits, so that what reaches the resharding is a plain sum.
    if (e->op() == OpType::Mean && waiting) return scaledMean(result, compute, compute_mesh);
    if (waiting)
      return result;  // reduced at the annotated tensor it flows into (a reduce-scatter where that is sharded)
    if (result->deviceMesh() != mesh || !(shardingOf(result) == final_target))
      result = reshard(result, mesh, final_target);
    if (e->op() == OpType::Mean) result = scaledMean(result, compute, compute_mesh);
    if (widened) {
      // Back to the op's dtype by a set, not a cast: inside a fused kernel a Half value keeps float32
      // precision (a cast would round there, and a sum of squares over 65504 divided by N after it
      // would overflow); it is rounded where it is stored, as the unsharded reduction's result is.
      result = emitSet(result, *result->deviceMesh(), shardingOf(result), e->out()->dtype());
    }
    return result;
  }

  // `mean` / parts, where parts is the number of devices its Partial mesh dimensions span.
  TensorView* scaledMean(TensorView* mean, const Sharding& compute, const DeviceMesh& compute_mesh) {
    int64_t parts = 1;
    for (int d = 0; d < kMeshDims; ++d)
      if (compute.partial[d]) parts *= compute_mesh.size(meshParallelType(d));
    if (parts == 1) return mean;
    Scalar* inv = out_->newScalar(DataType::Double, 1.0 / static_cast<double>(parts));
    TensorView* scaled = newTv(mean, mean->dtype(), *mean->deviceMesh(), shardingOf(mean));
    out_->newExpr(OpType::Mul, {mean, inv}, {scaled});
    return scaled;
  }

  // An add expr in a scratch fusion used only to describe axis mappings for the bias add.
  const Expr* biasAdd(TensorView* lhs, TensorView* bias) {
    scratch_.push_back(std::make_unique<Fusion>());
    Fusion& f = *scratch_.back();
    TensorView* a = f.newTensor(lhs->dtype(), lhs->shape());
    TensorView* b = f.newTensor(bias->dtype(), bias->shape());
    ops::binary(OpType::Add, a, b);
    return f.exprs().back().get();
  }

  // `dtype`: the piece's result type where it differs from the op's (a Half sum's float32 partial).
  TensorView* lowerPiece(const Expr* e, OpType op, std::vector<Val*> inputs, const DeviceMesh& mesh,
                         const Sharding& out_s, std::optional<DataType> dtype = std::nullopt) {
    std::vector<Val*> ready;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i]->isTensor()) {
        ready.push_back(inputs[i]);
        continue;
      }
      auto* tv = static_cast<TensorView*>(inputs[i]);
      Sharding partial_src = tv->deviceMesh() == mesh ? shardingOf(tv) : Sharding{};
      Sharding need = requiredInput(e, i, tv, out_s, partial_src, mesh);
      ready.push_back(reshard(tv, mesh, need));
    }
    ExprAttributes attrs = e->attrs();
    TensorView* out = newTv(e->out(), dtype.value_or(ops::resultType(op, ready, attrs)), mesh,
                            out_s);  // a piece (linear without bias) keeps the shape
    out_->newExpr(op, ready, {out}, attrs);
    return out;
  }

  void lowerExpr(const Expr* e) {
    std::vector<Val*> inputs;
    for (Val* v : e->inputs()) inputs.push_back(mapped(v));
    const TensorView* orig_out = e->out();
    if (!default_mesh_) {  // single device: copy as is (every result of a multi-output expr)
      std::vector<Val*> outs;
      for (Val* o : e->outputs()) {
        auto* tv = static_cast<TensorView*>(o);
        outs.push_back(out_->newTensor(tv->dtype(), tv->shape(), tv->contiguity()));
        map_[o->id()] = outs.back();
      }
      out_->newExpr(e->op(), inputs, outs, e->attrs());
      return;
    }
    if (isAttention(e->op())) {
      lowerAttention(e, inputs);
      return;
    }
    DeviceMesh mesh;
    std::optional<Sharding> target;
    if (orig_out->hasDeviceMesh()) {
      mesh = *orig_out->deviceMesh();
      target = shardingOf(orig_out);
      if (target->isPartial()) throw UserError(orig_out->name() + ": outputs cannot be declared Partial");
    } else {
      mesh = *default_mesh_;
      for (Val* v : inputs)
        if (v->isTensor()) {
          mesh = *static_cast<TensorView*>(v)->deviceMesh();
          break;
        }
    }
    TensorView* result;
    if (e->op() == OpType::Set && target) {
      // A user's set between shardings is the communication itself.
      result = reshard(static_cast<TensorView*>(inputs[0]), mesh, *target);
      if (result == inputs[0]) result = lowerCompute(e, inputs, mesh, target);
    } else {
      result = lowerCompute(e, inputs, mesh, target);
    }
    // Stream splits ride on the final tensor: HostIrLower turns them into a pipelined loop.
    if (orig_out->streamAxis() >= 0 && result->deviceMesh() == orig_out->deviceMesh() &&
        shardingOf(result) == shardingOf(orig_out))
      result->setLoop(orig_out->loop());
    // ... and on the communication's result a bias add was split from (row-parallel linear + bias).
    if (orig_out->streamAxis() >= 0 && result->definition() && isPointwise(result->definition()->op())) {
      TensorView* producer = result->definition()->inputTv(0);
      if (producer && producer->deviceMesh() == result->deviceMesh() && shardingOf(producer) == shardingOf(result) &&
          producer->shape() == result->shape() && producer->definition() && isResharding(producer->definition()))
        producer->setLoop(orig_out->loop());
    }
    map_[orig_out->id()] = result;
  }

  // Attention computes each (batch, head) on its own, so q's batch/head sharding, given to every
  // operand and result, needs no communication (operands sharded otherwise are resharded to it).
  // The sequence and head-dim axes cannot be sharded: that would need ring attention.
  void lowerAttention(const Expr* e, const std::vector<Val*>& inputs) {
    const std::string op = toString(e->op());
    auto rejectSequenceSharding = [&](const TensorView* tv, const Sharding& sh) {
      static const char* names[] = {"batch", "heads", "sequence", "head dim"};
      for (int d = 0; d < kMeshDims; ++d)
        if (sh.axis[d] >= 2)
          throw UserError(op + ": " + tv->name() + " is sharded on axis " + std::to_string(sh.axis[d]) + " (" +
                          names[std::min(sh.axis[d], 3)] + ") over " + toString(meshParallelType(d)) +
                          "; attention can shard only batch (axis 0) and heads (axis 1)" +
                          (sh.axis[d] == 2 ? ": sequence sharding (ring attention) is not supported" : ""));
    };
    for (Val* v : e->inputs())
      if (v->isTensor()) rejectSequenceSharding(static_cast<TensorView*>(v), shardingOf(static_cast<TensorView*>(v)));
    for (Val* v : e->outputs())
      rejectSequenceSharding(static_cast<TensorView*>(v), shardingOf(static_cast<TensorView*>(v)));

    const size_t qi = e->op() == OpType::SdpaFwd ? size_t{ops::sdpa::kQ} : size_t{ops::sdpa::kBwdQ};
    auto* q = static_cast<TensorView*>(inputs[qi]);
    const DeviceMesh mesh = *q->deviceMesh();
    Sharding compute;
    const Sharding qs = shardingOf(q);
    for (int d = 0; d < kMeshDims; ++d) compute.axis[d] = qs.axis[d] <= 1 ? qs.axis[d] : -1;
    auto shardingFor = [&](const TensorView* tv) { return tv->ndim() >= 2 ? compute : Sharding{}; };
    std::vector<Val*> ready;
    for (Val* v : inputs) {
      auto* tv = v->isTensor() ? static_cast<TensorView*>(v) : nullptr;
      ready.push_back(tv ? reshard(tv, mesh, shardingFor(tv)) : v);
    }
    std::vector<Val*> results;
    for (Val* o : e->outputs()) {
      auto* tv = static_cast<TensorView*>(o);
      results.push_back(newTv(tv, tv->dtype(), mesh, shardingFor(tv)));
    }
    out_->newExpr(e->op(), ready, results, e->attrs());
    for (size_t i = 0; i < results.size(); ++i) {
      auto* orig = static_cast<TensorView*>(e->outputs()[i]);
      auto* result = static_cast<TensorView*>(results[i]);
      if (orig->hasDeviceMesh()) {  // an annotated result: honoured (one communication at most)
        const Sharding target = shardingOf(orig);
        if (target.isPartial()) throw UserError(orig->name() + ": outputs cannot be declared Partial");
        if (result->deviceMesh() != orig->deviceMesh() || !(shardingOf(result) == target))
          result = reshard(result, *orig->deviceMesh(), target);
      }
      map_[orig->id()] = result;
    }
  }

  const Fusion& original_;
  const BoundShapes& bound_;
  ReshardingOptions options_;
  std::unique_ptr<Fusion> out_;
  std::vector<Val*> map_;
  std::optional<DeviceMesh> default_mesh_;
  std::map<std::tuple<TensorView*, std::vector<int64_t>, std::vector<int64_t>, std::array<int, 3>, std::array<bool, 3>>,
           TensorView*>
      reshard_cache_;
  std::vector<std::unique_ptr<Fusion>> scratch_;
};

}  // namespace

ReshardedFusion insertResharding(const Fusion& fusion, const BoundShapes& bound, const ReshardingOptions& options) {
  return ReshardingPass(fusion, bound, options).run();
}

}  // namespace meshfuse

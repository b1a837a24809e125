#include "host_ir/lower.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <unordered_set>

#include "host_ir/cast_forwarding.h"
#include "host_ir/matmul_epilogue.h"
#include "host_ir/view_merging.h"
#include "host_ir/wait_placement.h"
#include "multidevice/axis_map.h"
#include "multidevice/communicator.h"
#include "multidevice/resharding.h"
#include "multidevice/sharding.h"
#include "ops/shape_inference.h"
#include "runtime/normalization_plan.h"

namespace meshfuse {

GlobalShapes bindShapes(const Fusion& fusion, const GlobalShapes& input_shapes) {
  GlobalShapes shapes = input_shapes;
  for (const auto& e : fusion.exprs()) {
    std::vector<std::vector<int64_t>> in;
    for (Val* v : e->inputs()) {
      if (!v->isTensor()) {
        in.emplace_back();
        continue;
      }
      auto it = shapes.find(v);
      if (it == shapes.end()) throw std::logic_error("bindShapes: " + v->name() + " has no shape");
      in.push_back(it->second);
    }
    std::vector<std::vector<int64_t>> outs = inferShapes(e.get(), in);
    for (size_t i = 0; i < outs.size(); ++i) shapes[e->outputs()[i]] = std::move(outs[i]);
  }
  for (const auto& v : fusion.vals())
    if (v->isTensor() && shapes.count(v.get()))
      checkShardable(static_cast<const TensorView*>(v.get()), shapes.at(v.get()));
  return shapes;
}

namespace {
bool onThisRank(const TensorView* tv, int64_t rank) { return !tv->hasDeviceMesh() || tv->deviceMesh()->has(rank); }

// The mesh dimension along which two shardings on one mesh differ (resharding changes exactly one).
int differingDim(const Sharding& a, const Sharding& b) {
  for (int d = 0; d < kMeshDims; ++d)
    if (a.axis[d] != b.axis[d] || a.partial[d] != b.partial[d]) return d;
  return -1;
}

// The mesh parallel types along which a set resolves a Partial value to a replicated one in one
// allreduce (resharding merges such dims into one set), or empty when the set changes one dim
// or changes something else.
std::vector<ParallelType> mergedAllreduceDims(const Sharding& a, const Sharding& b) {
  std::vector<ParallelType> dims;
  for (int d = 0; d < kMeshDims; ++d) {
    if (a.axis[d] == b.axis[d] && a.partial[d] == b.partial[d]) continue;
    if (!a.partial[d] || b.partial[d] || b.axis[d] >= 0) return {};
    dims.push_back(meshParallelType(d));
  }
  return dims.size() > 1 ? dims : std::vector<ParallelType>{};
}

// A max over an axis of extent 0 has no identity (numpy raises): the plain reduction kernel said so,
// but a max fused into a normalization segment returned -inf. Checked once, before any kernel.
void checkMaxesHaveElements(const Fusion& fusion, const ShapeMap& local) {
  for (const Expr* e : fusion.liveExprs()) {
    if (e->op() != OpType::ReduceMax) continue;
    const auto in = local.find(e->input(0));
    const auto out = local.find(e->out());
    if (in == local.end() || out == local.end()) continue;
    const bool empty_axis = std::any_of(e->attrs().axes.begin(), e->attrs().axes.end(),
                                        [&](int64_t a) { return in->second[static_cast<size_t>(a)] == 0; });
    if (empty_axis && numelOf(out->second) > 0)
      throw UserError("max(" + e->input(0)->name() + "): reducing an axis of extent 0 has no identity");
  }
}

// The reduction a Partial tensor waits for: its producer's, read back through the views and sets
// a Partial passes through (resharding's passesPartial) to the op that made it Partial.
ReduceOp partialOp(const TensorView* partial) {
  const Expr* def = partial->definition();
  while (def && (def->op() == OpType::Reshape || def->op() == OpType::Permute || def->op() == OpType::Set) &&
         def->inputTv(0)->definition())
    def = def->inputTv(0)->definition();
  return def && def->op() == OpType::ReduceMax ? ReduceOp::Max : ReduceOp::Sum;
}
}  // namespace

std::unique_ptr<HostIrContainer> HostIrLower::lower(const Fusion& fusion, const GlobalShapes& shapes, int64_t rank,
                                                    Device device) {
  hic_ = std::make_unique<HostIrContainer>();
  hic_->rank = rank;
  hic_->device = device;
  open_pointwise_ = -1;
  for (const auto& [val, global] : shapes)
    hic_->local_shapes[val] = localShape(static_cast<const TensorView*>(val), global);
  if (isMultiDevice(fusion)) {
    const Communicator& comm = Communicator::instance();
    backend_ = comm.resolve(params_.communicator_backend, device);
    if (!comm.isAvailable(backend_)) {
      std::string available;
      for (CommunicatorBackend b : comm.availableBackends()) available += (available.empty() ? "" : ", ") + toString(b);
      throw UserError("communicator backend '" + toString(backend_) +
                      "' is not available in this build; available: " + available);
    }
  }
  checkMaxesHaveElements(fusion, hic_->local_shapes);
  findStreamLoops(fusion, shapes);
  findEpilogues(fusion);
  findNormalizationSegments(fusion);
  for (Expr* e : fusion.liveExprs()) {
    if (auto plan = loop_at_.find(e); plan != loop_at_.end()) {
      lowerStreamLoop(plan->second.matmul, plan->second.set, plan->second.kind);
      hic_->loops.back().chunks = plan->second.chunks;
    } else if (absorbed_.count(e) || in_epilogue_.count(e)) {
      continue;
    } else if (auto fold = epilogue_at_.find(e); fold != epilogue_at_.end()) {
      lowerMatmulWithEpilogue(e, fold->second);
    } else if (auto norm = normalization_at_.find(e); norm != normalization_at_.end()) {
      lowerNormalization(norm->second);
    } else if (in_normalization_.count(e)) {
      continue;
    } else if (isResharding(e)) {
      lowerResharding(e);
    } else {
      lowerCompute(e);
    }
  }
  // `auto` is chosen per team: a team whose members each have a GPU of their own gets NCCL even
  // where the world's ranks share GPUs (the choice for the world, above, only decides availability).
  if (isMultiDevice(fusion))
    for (Communication& c : hic_->communications)
      c.backend = Communicator::instance().resolve(params_.communicator_backend, device, c.team);
  forwardWideningCasts(fusion, *hic_);
  finishSegments(fusion);
  recordRandomBlocks(shapes);
  placeWaits(*hic_);
  mergeAdjacentViews(fusion, *hic_);
  return std::move(hic_);
}

namespace {
bool isMatmul(const Expr* e) { return e->op() == OpType::Matmul || e->op() == OpType::Linear; }

// The mesh dim a same-mesh resharding set changes, or -1.
int reshardedDim(const Expr* set) {
  if (!isResharding(set) || set->inputTv(0)->deviceMesh() != set->out()->deviceMesh()) return -1;
  if (!mergedAllreduceDims(shardingOf(set->inputTv(0)), shardingOf(set->out())).empty()) return -1;
  return differingDim(shardingOf(set->inputTv(0)), shardingOf(set->out()));
}

void checkChunks(const TensorView* tv, int64_t local_rows, int64_t chunks) {
  if (chunks <= 0 || local_rows % chunks != 0)
    throw UserError(tv->name() + ": the stream split into " + std::to_string(chunks) + " chunks does not divide the " +
                    std::to_string(local_rows) + " rows each device holds along axis 0");
}

// A row-parallel linear with a bias is lowered as the reduce-scatter of the product, then the bias
// added to the scattered rows: a stream split the user put on the linear's result sits on that add
// (and resharding may carry it to the scattered rows). It pipelines the reduce-scatter all the same;
// the bias is added to the whole result after the loop. Returns that add's result, or nullptr.
TensorView* streamSplitBiasAddAfter(TensorView* y) {
  if (y->uses().size() != 1) return nullptr;
  const Expr* add = y->uses()[0];
  if (add->op() != OpType::Add || add->out()->streamAxis() != 0 || add->inputTv(0) != y) return nullptr;
  return add->out();
}
}  // namespace

// Finds allgather -> matmul and matmul -> reduce-scatter pairs whose result is stream-parallel on
// axis 0: they become one pipelined loop instead of a communication and a launch.
void HostIrLower::findStreamLoops(const Fusion& fusion, const GlobalShapes& shapes) {
  loop_at_.clear();
  absorbed_.clear();
  std::set<const TensorView*> pipelined;  // the stream-split tensors a loop realizes
  const int64_t rank = hic_->rank;
  for (Expr* e : fusion.liveExprs()) {
    if (!isMatmul(e) || !onThisRank(e->out(), rank)) continue;
    TensorView* out = e->out();
    // Allgather of the first operand along the rows, then the matmul.
    TensorView* x = e->inputTv(0);
    const Expr* gather = x->definition();
    if (out->streamAxis() == 0 && gather && x->uses().size() == 1 && !fusion.isOutput(x) && x->ndim() >= 2) {
      int d = reshardedDim(gather);
      Sharding ps = d >= 0 ? shardingOf(gather->inputTv(0)) : Sharding{};
      if (d >= 0 && ps.axis[d] == 0 && shardingOf(x).axis[d] < 0 && !ps.partial[d] && inputToOutputAxes(e, 0)[0] == 0) {
        int64_t chunks = out->streamChunks(shapes.at(out)[0]);
        checkChunks(out, hic_->local_shapes.at(gather->inputTv(0))[0], chunks);
        loop_at_[e] = {e, gather, StreamLoop::Kind::AllgatherThenMatmul, chunks};
        absorbed_[gather] = true;
        continue;
      }
    }
    // The matmul's Partial result reduce-scattered along the rows.
    if (out->isPartial() && out->uses().size() == 1 && e->inputTv(0)->ndim() >= 2 && inputToOutputAxes(e, 0)[0] == 0) {
      const Expr* scatter = out->uses()[0];
      int d = reshardedDim(scatter);
      TensorView* y = scatter->out();
      TensorView* bias_sum = streamSplitBiasAddAfter(y);
      TensorView* split = y->streamAxis() < 0 && bias_sum != nullptr ? bias_sum : y;
      if (d >= 0 && shardingOf(y).axis[d] == 0 && split->streamAxis() == 0) {
        int64_t chunks = split->streamChunks(shapes.at(split)[0]);
        checkChunks(split, hic_->local_shapes.at(y)[0], chunks);
        loop_at_[scatter] = {e, scatter, StreamLoop::Kind::MatmulThenReduceScatter, chunks};
        absorbed_[e] = true;
        if (bias_sum != nullptr) pipelined.insert(bias_sum);
      }
    }
  }
  // A stream split no loop uses is a schedule the user asked for and would not get: it used to be
  // dropped silently (the program then ran unpipelined), so it is an error naming the two forms.
  for (const auto& [at, plan] : loop_at_)
    pipelined.insert(plan.kind == StreamLoop::Kind::AllgatherThenMatmul ? plan.matmul->out() : plan.set->out());
  for (const auto& v : fusion.vals()) {
    if (!v->isTensor()) continue;
    const auto* tv = static_cast<const TensorView*>(v.get());
    if (tv->streamAxis() < 0 || pipelined.count(tv) || !onThisRank(tv, rank)) continue;
    throw UserError(tv->name() + ": its stream split " + tv->loopToString() +
                    " pipelines nothing: a stream axis is the rows (axis 0) of a matmul's result whose first "
                    "operand is allgathered along its rows, or of a reduce-scatter of a matmul's result along its "
                    "rows (docs/overlap.md)");
  }
}

void HostIrLower::lowerStreamLoop(const Expr* matmul, const Expr* set, StreamLoop::Kind kind) {
  size_t before = hic_->communications.size();
  size_t program_size = hic_->program.size();
  lowering_stream_loop_ = true;
  lowerResharding(set);  // builds the Communication template (and posts it: undone below)
  lowering_stream_loop_ = false;
  if (hic_->communications.size() != before + 1) throw std::logic_error("stream loop: expected one communication");
  hic_->program.resize(program_size);
  Segment seg;
  seg.kind = Segment::Kind::Matmul;
  seg.exprs.push_back(matmul);
  hic_->segments.push_back(std::move(seg));
  StreamLoop loop;
  loop.kind = kind;
  loop.communication = static_cast<int>(before);
  loop.segment = static_cast<int>(hic_->segments.size()) - 1;
  hic_->loops.push_back(loop);
  Instruction ins;
  ins.kind = Instruction::Kind::StreamForLoop;
  ins.index = static_cast<int>(hic_->loops.size()) - 1;
  hic_->program.push_back(ins);
  open_pointwise_ = -1;
}

// Groups runs of consecutive local exprs into normalization segments: from each reduction, the
// earliest start (pointwise producers) and then the furthest end (more reductions over the same
// axes, pointwise consumers) for which planNormalization accepts the run. Greedy and in definition
// order, so a segment never moves an expr past another.
void HostIrLower::findNormalizationSegments(const Fusion& fusion) {
  normalization_at_.clear();
  in_normalization_.clear();
  std::vector<const Expr*> run;
  auto plans = [&](size_t begin, size_t end) {
    std::vector<const Expr*> part(run.begin() + static_cast<std::ptrdiff_t>(begin),
                                  run.begin() + static_cast<std::ptrdiff_t>(end));
    return planNormalization(part, hic_->local_shapes).has_value();
  };
  auto flush = [&] {
    size_t i = 0;
    while (i < run.size()) {
      size_t r = i;
      while (r < run.size() && !isReduction(run[r]->op())) ++r;
      if (r == run.size()) break;
      size_t begin = i;
      while (begin <= r && !plans(begin, r + 1)) ++begin;
      if (begin > r) {
        i = r + 1;
        continue;
      }
      size_t end = r + 1;
      while (end < run.size() && plans(begin, end + 1)) ++end;
      if (end - begin > 1) {
        std::vector<const Expr*> group(run.begin() + static_cast<std::ptrdiff_t>(begin),
                                       run.begin() + static_cast<std::ptrdiff_t>(end));
        for (const Expr* e : group) in_normalization_[e] = true;
        normalization_at_[group.front()] = std::move(group);
      }
      i = end;
    }
    run.clear();
  };
  for (Expr* e : fusion.liveExprs()) {
    const bool candidate = normalizationCandidate(e) && !isResharding(e) && !absorbed_.count(e) && !loop_at_.count(e) &&
                           !in_epilogue_.count(e) && onThisRank(e->out(), hic_->rank);
    if (candidate)
      run.push_back(e);
    else
      flush();
  }
  flush();
}

// Matmuls whose following pointwise chain a GEMM epilogue computes (host_ir/matmul_epilogue.h),
// outside stream loops (which run their matmul chunk by chunk). MESHFUSE_MATMUL_EPILOGUES=0 turns
// the folding off (to measure what it saves).
void HostIrLower::findEpilogues(const Fusion& fusion) {
  epilogue_at_.clear();
  in_epilogue_.clear();
  static const bool enabled = [] {
    const char* v = std::getenv("MESHFUSE_MATMUL_EPILOGUES");
    return v == nullptr || std::string(v) != "0";
  }();
  if (!enabled) return;
  const int64_t rank = hic_->rank;
  epilogue_at_ = findMatmulEpilogues(fusion, [&](const Expr* e) {
    return onThisRank(e->out(), rank) && !isResharding(e) && !absorbed_.count(e) && !loop_at_.count(e);
  });
  for (const auto& [matmul, fold] : epilogue_at_)
    for (const Expr* e : fold.exprs) in_epilogue_.insert(e);
}

void HostIrLower::lowerMatmulWithEpilogue(const Expr* matmul, const EpilogueFold& fold) {
  Segment seg;
  seg.kind = Segment::Kind::Matmul;
  seg.exprs.push_back(matmul);
  seg.exprs.insert(seg.exprs.end(), fold.exprs.begin(), fold.exprs.end());
  seg.epilogue = fold.epilogue;
  launchClosedSegment(std::move(seg));
}

void HostIrLower::lowerNormalization(const std::vector<const Expr*>& exprs) {
  Segment seg;
  seg.kind = Segment::Kind::Normalization;
  seg.exprs = exprs;
  launchClosedSegment(std::move(seg));
}

// Appends `seg` and its launch; no later pointwise expr joins it.
void HostIrLower::launchClosedSegment(Segment seg) {
  hic_->segments.push_back(std::move(seg));
  Instruction ins;
  ins.kind = Instruction::Kind::LaunchSegment;
  ins.index = static_cast<int>(hic_->segments.size()) - 1;
  hic_->program.push_back(ins);
  open_pointwise_ = -1;
}

// A sharded uniform()/normal() generates its block of the global tensor: record the block (and so
// does sharded attention, for its dropout mask).
void HostIrLower::recordRandomBlocks(const GlobalShapes& shapes) {
  for (Segment& seg : hic_->segments) {
    for (const Expr* e : seg.exprs) {
      const TensorView* out = e->out();
      // Attention records its first output's block: its dropout mask is indexed by global (batch, head).
      if (!(isRandom(e->op()) || isAttention(e->op())) || !out->isSharded() || !out->hasDeviceMesh()) continue;
      GlobalBlock block;
      block.global_shape = shapes.at(out);
      block.offsets.assign(block.global_shape.size(), 0);
      const std::vector<int64_t>& local = hic_->local_shapes.at(out);
      const Sharding s = shardingOf(out);
      for (int d = 0; d < kMeshDims; ++d)
        if (s.axis[d] >= 0)
          block.offsets[s.axis[d]] += out->deviceMesh()->coordinate(hic_->rank, meshParallelType(d)) * local[s.axis[d]];
      seg.global_blocks[out] = std::move(block);
    }
  }
}

namespace {
// What a CPU pointwise segment computes in (runtime/cpu/pointwise.cpp): int64 when every value is an
// integer or Bool and every op exact on integers, else float or double. An integer op in a segment
// with floating values is computed in double, exact only to 2**53: Int64 results lost their low bits
// when a float op shared the segment. So on the CPU an integer op (an Int or Int32 value among its
// values) and a floating one (a floating value among its values) do not share a segment; an op of
// Bools alone joins either.
enum class ValueClass { Bools, Integers, Floating };

ValueClass valueClassOf(const Expr* e) {
  bool integers = false;
  auto visit = [&](const Val* v) {
    if (isFloatingPoint(v->dtype())) return false;
    integers = integers || (v->isTensor() && v->dtype() != DataType::Bool);
    return true;
  };
  bool exact = isExactOnIntegers(e->op()) && visit(e->out());
  for (const Val* v : e->inputs()) exact = exact && (v->isTensor() ? visit(v) : !isFloatingPoint(v->dtype()));
  if (!exact) return ValueClass::Floating;
  return integers ? ValueClass::Integers : ValueClass::Bools;
}

bool mixesIntegersWithFloats(const Segment& open, const Expr* e) {
  const ValueClass mine = valueClassOf(e);
  if (mine == ValueClass::Bools) return false;
  return std::any_of(open.exprs.begin(), open.exprs.end(), [&](const Expr* x) {
    const ValueClass theirs = valueClassOf(x);
    return theirs != ValueClass::Bools && theirs != mine;
  });
}
}  // namespace

void HostIrLower::lowerCompute(const Expr* e) {
  if (!onThisRank(e->out(), hic_->rank)) return;
  Segment::Kind kind = segmentKindOf(e->op());
  bool joins = false;
  if (kind == Segment::Kind::Pointwise && open_pointwise_ >= 0 && !hic_->program.empty() &&
      hic_->program.back().kind == Instruction::Kind::LaunchSegment && hic_->program.back().index == open_pointwise_) {
    const Segment& open = hic_->segments[open_pointwise_];
    joins = hic_->local_shapes.at(open.exprs.front()->out()) == hic_->local_shapes.at(e->out()) &&
            !(hic_->device.type == DeviceType::CPU && mixesIntegersWithFloats(open, e));
  }
  if (joins) {
    hic_->segments[open_pointwise_].exprs.push_back(e);
    return;
  }
  Segment seg;
  seg.kind = kind;
  seg.exprs.push_back(e);
  hic_->segments.push_back(std::move(seg));
  int index = static_cast<int>(hic_->segments.size()) - 1;
  Instruction ins;
  ins.kind = Instruction::Kind::LaunchSegment;
  ins.index = index;
  if (viewsAheadOfOpenPointwise(e)) {
    // Launched before the open pointwise segment, which stays open: a broadcast of a LayerNorm
    // statistic between two pointwise ops no longer splits them into two kernels.
    hic_->program.insert(hic_->program.end() - 1, ins);
    return;
  }
  open_pointwise_ = kind == Segment::Kind::Pointwise ? index : -1;
  hic_->program.push_back(ins);
}

// A view that never copies (broadcast_in_dim, permute, slice) of values the open pointwise segment
// does not compute can run before that segment, so the segment stays open for the pointwise ops
// after the view.
bool HostIrLower::viewsAheadOfOpenPointwise(const Expr* e) const {
  const OpType op = e->op();
  if (op != OpType::BroadcastInDim && op != OpType::Permute && op != OpType::Slice) return false;
  if (open_pointwise_ < 0 || hic_->program.empty()) return false;
  const Instruction& last = hic_->program.back();
  if (last.kind != Instruction::Kind::LaunchSegment || last.index != open_pointwise_) return false;
  const std::vector<const Expr*>& open = hic_->segments[open_pointwise_].exprs;
  for (const Val* in : e->inputs())
    for (const Expr* producer : open)
      if (std::find(producer->outputs().begin(), producer->outputs().end(), in) != producer->outputs().end())
        return false;
  return true;
}

void HostIrLower::lowerResharding(const Expr* e) {
  TensorView* in = e->inputTv(0);
  TensorView* out = e->out();
  const DeviceMesh& pm = *in->deviceMesh();
  const DeviceMesh& cm = *out->deviceMesh();
  const int64_t rank = hic_->rank;
  Sharding ps = shardingOf(in), cs = shardingOf(out);
  Communication c;
  c.in = in;
  c.out = out;
  c.backend = backend_;
  auto unsupported = [&](const std::string& why) {
    return UserError("cannot lower the resharding " + out->name() + " (" + cm.toString() + ", " + cs.toString() +
                     ") <- " + in->name() + " (" + pm.toString() + ", " + ps.toString() + "): " + why);
  };
  auto local = [&](Instruction::Kind kind, int axis, int64_t parts, int64_t block) {
    Instruction ins;
    ins.kind = kind;
    ins.in = in;
    ins.out = out;
    ins.axis = axis;
    ins.parts = parts;
    ins.block = block;
    hic_->program.push_back(ins);
  };
  if (pm == cm) {
    if (!pm.has(rank)) return;
    if (const std::vector<ParallelType> dims = mergedAllreduceDims(ps, cs); !dims.empty()) {
      // Partial along several dims: one allreduce over the team they span (resharding merged them).
      c.team = pm.team(rank, dims);
      if (c.team.size() == 1 && !lowering_stream_loop_) {
        local(Instruction::Kind::LocalCopy, -1, 1, 0);
        return;
      }
      c.op = partialOp(in);
      c.type = Communication::Type::Allreduce;
    } else {
      int d = differingDim(ps, cs);
      ParallelType p = meshParallelType(d);
      c.team = pm.team(rank, p);
      // Along a mesh dimension of size 1 every collective is the identity (one block, one summand):
      // the result is the input, with no communication posted. (A stream loop keeps its
      // communication: the loop is built around it.)
      if (c.team.size() == 1 && !lowering_stream_loop_ && (ps.partial[d] || ps.axis[d] >= 0)) {
        local(Instruction::Kind::LocalCopy, -1, 1, 0);
        return;
      }
      if (ps.partial[d]) {
        c.op = partialOp(in);
        if (cs.axis[d] < 0) {
          c.type = Communication::Type::Allreduce;
        } else {
          c.type = Communication::Type::ReduceScatter;
          c.scattered_axis = cs.axis[d];
        }
      } else if (ps.axis[d] >= 0) {
        c.gathered_axis = ps.axis[d];
        if (cs.axis[d] < 0) {
          c.type = Communication::Type::Allgather;
        } else {
          c.type = Communication::Type::AllToAll;
          c.scattered_axis = cs.axis[d];
        }
      } else {
        local(Instruction::Kind::LocalSlice, cs.axis[d], pm.size(p), pm.coordinate(rank, p));
        return;
      }
    }
  } else if (pm.shape() == cm.shape() && ps == cs) {
    int64_t mine_src = pm.indexOf(rank), mine_dst = cm.indexOf(rank);
    if (mine_src < 0 && mine_dst < 0) return;
    // A rank can be in both meshes (overlapping stages): one instruction sends, one receives.
    c.type = Communication::Type::SendRecv;
    if (mine_src >= 0) {
      int64_t dst = cm.devices()[mine_src];
      if (dst == rank) {
        local(Instruction::Kind::LocalCopy, -1, 1, 0);
      } else {
        Communication s = c;
        s.team = {std::min(rank, dst), std::max(rank, dst)};
        s.send_to = dst;
        hic_->communications.push_back(s);
        hic_->program.push_back(
            Instruction{Instruction::Kind::PostCommunication, static_cast<int>(hic_->communications.size()) - 1});
      }
    }
    if (mine_dst >= 0) {
      int64_t src = pm.devices()[mine_dst];
      if (src == rank) return;  // the LocalCopy above
      c.team = {std::min(rank, src), std::max(rank, src)};
      c.recv_from = src;
    } else {
      return;
    }
  } else if (cm.size() == 1) {
    int64_t root = cm.devices()[0];
    bool p_partial = ps.isPartial();
    bool p_sharded = ps.axis[0] >= 0 || ps.axis[1] >= 0 || ps.axis[2] >= 0;
    if (!p_partial && !p_sharded) {
      if (pm.has(root)) {
        if (rank == root) local(Instruction::Kind::LocalCopy, -1, 1, 0);
        return;
      }
      c.type = Communication::Type::SendRecv;
      int64_t src = pm.devices()[0];
      c.team = {std::min(src, root), std::max(src, root)};
      if (rank == src)
        c.send_to = root;
      else if (rank == root)
        c.recv_from = src;
      else
        return;
    } else {
      if (pm.rank() != 1) throw unsupported("gathering or reducing onto one device needs a 1-D source mesh");
      if (!pm.has(root)) throw unsupported("the destination device must be part of the source mesh");
      if (!pm.has(rank)) return;
      c.team = pm.devices();
      c.root = pm.indexOf(root);
      if (p_partial) {
        c.type = Communication::Type::Reduce;
        c.op = partialOp(in);
      } else {
        c.type = Communication::Type::Gather;
        c.gathered_axis = ps.axis[0];
      }
    }
  } else if (pm.size() == 1) {
    int64_t root = pm.devices()[0];
    std::vector<int64_t> team = cm.devices();
    if (!cm.has(root)) team.insert(team.begin(), root);
    if (std::find(team.begin(), team.end(), rank) == team.end()) return;
    c.team = team;
    c.root = std::find(team.begin(), team.end(), root) - team.begin();
    if (cs.axis[0] < 0) {
      c.type = Communication::Type::Broadcast;
    } else {
      if (!cm.has(root)) throw unsupported("a scatter's root must be a device of the destination mesh");
      c.type = Communication::Type::Scatter;
      c.scattered_axis = cs.axis[0];
    }
  } else {
    throw unsupported("meshes of different shapes");
  }
  hic_->communications.push_back(c);
  Instruction ins;
  ins.kind = Instruction::Kind::PostCommunication;
  ins.index = static_cast<int>(hic_->communications.size()) - 1;
  hic_->program.push_back(ins);
  open_pointwise_ = -1;
}

void HostIrLower::finishSegments(const Fusion& fusion) {
  const auto segments_of = segmentsOfExprs(hic_->segments);
  for (Segment& seg : hic_->segments) collectInputsAndOutputs(fusion, seg, segments_of, hic_->segments);
}

}  // namespace meshfuse

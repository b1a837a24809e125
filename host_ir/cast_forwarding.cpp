#include "host_ir/cast_forwarding.h"

#include <algorithm>

#include "runtime/dtype.h"
#include "runtime/normalization_plan.h"

namespace meshfuse {

namespace {

bool contains(const Segment& seg, const Expr* e) {
  return std::find(seg.exprs.begin(), seg.exprs.end(), e) != seg.exprs.end();
}

bool producedIn(const Segment& seg, const Val* v) {
  return std::any_of(seg.exprs.begin(), seg.exprs.end(), [&](const Expr* e) {
    return std::find(e->outputs().begin(), e->outputs().end(), v) != e->outputs().end();
  });
}

bool forwardable(const Segment& seg) {
  return seg.kind == Segment::Kind::Pointwise || seg.kind == Segment::Kind::Normalization;
}

// Whether segment `reader` can compute `cast` ahead of its own exprs.
bool canTake(const Segment& reader, const Expr* cast, const ShapeMap& shapes) {
  if (reader.kind == Segment::Kind::Pointwise)  // one shape per pointwise kernel
    return shapes.at(reader.exprs.front()->out()) == shapes.at(cast->out());
  std::vector<const Expr*> exprs{cast};
  exprs.insert(exprs.end(), reader.exprs.begin(), reader.exprs.end());
  return planNormalization(exprs, shapes).has_value();
}

// The segments whose exprs read `cast`'s result and do not compute it, or nullopt when such a
// reader is not a segment that could take the cast.
std::optional<std::vector<int>> readersTaking(const Fusion& fusion, const Expr* cast,
                                              const std::unordered_map<const Expr*, std::vector<int>>& segments_of,
                                              const HostIrContainer& hic) {
  if (fusion.isOutput(cast->out())) return std::nullopt;
  std::vector<int> readers;
  for (const Expr* use : cast->out()->uses()) {
    auto it = segments_of.find(use);
    if (it == segments_of.end()) return std::nullopt;  // a communication, or not lowered on this rank
    for (int s : it->second) {
      const Segment& seg = hic.segments[static_cast<size_t>(s)];
      // Readers that compute the value already (the cast was forwarded there) need nothing.
      if (producedIn(seg, cast->out()) || std::find(readers.begin(), readers.end(), s) != readers.end()) continue;
      if (!forwardable(seg) || !canTake(seg, cast, hic.local_shapes)) return std::nullopt;
      readers.push_back(s);
    }
  }
  return readers;
}

}  // namespace

std::unordered_map<const Expr*, std::vector<int>> segmentsOfExprs(const std::vector<Segment>& segments) {
  std::unordered_map<const Expr*, std::vector<int>> of;
  for (size_t s = 0; s < segments.size(); ++s)
    for (const Expr* e : segments[s].exprs) of[e].push_back(static_cast<int>(s));
  return of;
}

bool readOutsideItsSegments(const Fusion& fusion, const TensorView* value, const Segment& owner,
                            const std::unordered_map<const Expr*, std::vector<int>>& segments_of,
                            const std::vector<Segment>& segments) {
  if (fusion.isOutput(value)) return true;
  for (const Expr* use : value->uses()) {
    if (contains(owner, use)) continue;
    auto it = segments_of.find(use);
    if (it == segments_of.end()) return true;
    const auto computes = [&](int s) { return producedIn(segments[static_cast<size_t>(s)], value); };
    if (!std::all_of(it->second.begin(), it->second.end(), computes)) return true;
  }
  return false;
}

void collectInputsAndOutputs(const Fusion& fusion, Segment& seg,
                             const std::unordered_map<const Expr*, std::vector<int>>& segments_of,
                             const std::vector<Segment>& segments) {
  seg.inputs = inputsOf(seg.exprs);
  seg.outputs.clear();
  for (const Expr* e : seg.exprs)
    for (Val* v : e->outputs()) {  // every result of a multi-output expr (attention)
      auto* out = static_cast<TensorView*>(v);
      if (readOutsideItsSegments(fusion, out, seg, segments_of, segments)) seg.outputs.push_back(out);
    }
}

void forwardWideningCasts(const Fusion& fusion, HostIrContainer& hic) {
  bool emptied = false;
  for (size_t owner = 0; owner < hic.segments.size(); ++owner) {
    if (!forwardable(hic.segments[owner])) continue;
    // A copy: forwarding edits this segment's expr list.
    const std::vector<const Expr*> exprs = hic.segments[owner].exprs;
    for (const Expr* e : exprs) {
      if (e->op() != OpType::Cast || !e->inputs().front()->isTensor()) continue;
      const auto* operand = static_cast<const TensorView*>(e->inputs().front());
      if (producedIn(hic.segments[owner], operand) || dataTypeSize(e->out()->dtype()) <= dataTypeSize(operand->dtype()))
        continue;
      const auto segments_of = segmentsOfExprs(hic.segments);
      const auto readers = readersTaking(fusion, e, segments_of, hic);
      if (!readers || readers->empty()) continue;
      for (int r : *readers) {
        std::vector<const Expr*>& into = hic.segments[static_cast<size_t>(r)].exprs;
        into.insert(into.begin(), e);
      }
      // Kept where it is while that segment still reads it.
      Segment& own = hic.segments[owner];
      const bool read_here = std::any_of(own.exprs.begin(), own.exprs.end(), [&](const Expr* x) {
        return x != e && std::find(x->inputs().begin(), x->inputs().end(), e->out()) != x->inputs().end();
      });
      if (!read_here) {
        own.exprs.erase(std::find(own.exprs.begin(), own.exprs.end(), e));
        emptied = emptied || own.exprs.empty();
      }
    }
  }
  if (emptied) removeEmptySegments(hic);
}

}  // namespace meshfuse

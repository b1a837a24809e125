#include "runtime/normalization_plan.h"

#include <algorithm>
#include <stdexcept>

namespace meshfuse {

const NormalizationPlan::Value& NormalizationPlan::value(const Val* v) const {
  auto it = values.find(v);
  if (it == values.end()) throw std::logic_error("normalization plan: no entry for " + v->name());
  return it->second;
}

bool normalizationCandidate(const Expr* e) {
  const OpType op = e->op();
  return (isPointwise(op) && !isRandom(op)) || isReduction(op) || op == OpType::BroadcastInDim;
}

namespace {

using Plan = NormalizationPlan;
using Varies = Plan::Varies;

class Planner {
 public:
  Planner(const std::vector<const Expr*>& exprs, const ShapeMap& shapes) : exprs_(exprs), shapes_(shapes) {}

  std::optional<Plan> run(std::string& why) {
    try {
      build();
      return std::move(plan_);
    } catch (const Rejected& r) {
      why = r.why;
      return std::nullopt;
    }
  }

 private:
  struct Rejected {
    std::string why;
  };
  [[noreturn]] static void reject(const std::string& why) { throw Rejected{why}; }

  const std::vector<int64_t>& shape(const Val* v) const {
    auto it = shapes_.find(v);
    if (it == shapes_.end()) reject("no local shape for " + v->name());
    return it->second;
  }
  int rank() const { return static_cast<int>(plan_.full_shape.size()); }

  // Finds F and the split from the reductions: all inner (a suffix of F's axes) or all outer (a
  // prefix), inner and outer ones complementary.
  void chooseIterationSpace() {
    int inner_split = -1, outer_split = -1;
    for (const Expr* e : exprs_) {
      if (!isReduction(e->op())) continue;
      const std::vector<int64_t>& in = shape(e->input(0));
      if (plan_.full_shape.empty()) plan_.full_shape = in;
      if (in != plan_.full_shape)
        reject(e->input(0)->name() + " " + shapeToString(in) + " is reduced, but the segment iterates over " +
               shapeToString(plan_.full_shape));
      std::vector<int64_t> axes = e->attrs().axes;
      std::sort(axes.begin(), axes.end());
      const int n = static_cast<int>(axes.size()), r = static_cast<int>(in.size());
      if (n == 0 || n == r) reject(toString(e->op()) + " reduces no axis or every axis");
      const bool suffix = axes.front() == r - n && axes.back() == r - 1;
      const bool prefix = axes.front() == 0 && axes.back() == n - 1;
      if (suffix && (inner_split < 0 || inner_split == r - n)) {
        inner_split = r - n;
        plan_.has_inner_reduction = true;
      } else if (prefix && (outer_split < 0 || outer_split == n)) {
        outer_split = n;
        plan_.has_outer_reduction = true;
        outer_reductions_.push_back(e);
      } else {
        reject(toString(e->op()) + " over axes " + shapeToString(axes) + " is neither the inner nor the outer axes");
      }
    }
    if (plan_.full_shape.empty()) reject("no reduction");
    if (inner_split >= 0 && outer_split >= 0 && inner_split != outer_split)
      reject("inner and outer reductions do not split the axes at one place");
    plan_.split = inner_split >= 0 ? inner_split : outer_split;
    if (plan_.split < 0) reject("no reduction splits the axes");  // each reduction set one or was rejected
    for (int d = 0; d < rank(); ++d) (d < plan_.split ? plan_.rows : plan_.row_length) *= plan_.full_shape[d];
  }

  // The F axes of a value of `s` right-aligned with a value whose axes are `to` (numpy's rule).
  std::vector<int> rightAligned(const Val* v, const std::vector<int64_t>& s, const std::vector<int>& to) const {
    if (s.size() > to.size()) reject(v->name() + " has more axes than the values it combines with");
    std::vector<int> axes(to.end() - static_cast<std::ptrdiff_t>(s.size()), to.end());
    for (size_t i = 0; i < s.size(); ++i) checkExtent(v, s[i], axes[i]);
    return axes;
  }

  void checkExtent(const Val* v, int64_t extent, int f) const {
    if (extent != 1 && extent != plan_.full_shape[f])
      reject(v->name() + " has extent " + std::to_string(extent) + " on F's axis " + std::to_string(f) + " of extent " +
             std::to_string(plan_.full_shape[f]));
  }

  std::vector<int> identity() const {
    std::vector<int> axes(rank());
    for (int d = 0; d < rank(); ++d) axes[d] = d;
    return axes;
  }

  bool known(const Val* v) const { return plan_.values.count(v) > 0; }

  void record(const Val* v, std::vector<int> axes, uint64_t along, bool after_outer) {
    const uint64_t outer_bits = (uint64_t{1} << plan_.split) - 1;
    const bool outer = (along & outer_bits) != 0, inner = (along & ~outer_bits) != 0;
    Plan::Value val;
    val.axes = std::move(axes);
    val.along = along;
    val.varies = outer && inner ? Varies::PerElement
                 : outer        ? Varies::PerRow
                 : inner        ? Varies::PerColumn
                                : Varies::Nothing;
    val.after_outer_reduction = after_outer;
    auto [it, fresh] = plan_.values.emplace(v, val);
    if (!fresh && it->second.axes != val.axes) reject(v->name() + " lines up with F in two different ways");
  }

  // A tensor read from outside the segment, lined up with F (same rank) or right-aligned with `to`;
  // it changes along the axes where it has F's extent.
  void recordInput(const Val* v, const std::vector<int>& to) {
    if (!v->isTensor() || known(v)) return;
    const auto& s = shape(v);
    std::vector<int> axes = static_cast<int>(s.size()) == rank() ? identity() : rightAligned(v, s, to);
    uint64_t along = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      checkExtent(v, s[i], axes[i]);
      if (s[i] == plan_.full_shape[axes[i]]) along |= uint64_t{1} << axes[i];
    }
    record(v, axes, along, false);
  }

  bool afterOuter(const Val* v) const {
    auto it = plan_.values.find(v);
    return it != plan_.values.end() && it->second.after_outer_reduction;
  }

  void pointwise(const Expr* e) {
    const Val* out = e->out();
    const auto& s = shape(out);
    // Output axes: F's when it has F's rank, else those of an operand of its rank, else
    // right-aligned with F.
    std::vector<int> axes = identity();
    if (static_cast<int>(s.size()) != rank()) {
      bool found = false;
      for (const Val* in : e->inputs()) {
        if (!in->isTensor() || !known(in) || shape(in).size() != s.size()) continue;
        axes = plan_.value(in).axes;
        found = true;
        break;
      }
      if (!found) {
        if (s.size() > static_cast<size_t>(rank())) reject(out->name() + " has more axes than F");
        axes.erase(axes.begin(), axes.begin() + (rank() - static_cast<int>(s.size())));
      }
    }
    for (size_t i = 0; i < s.size(); ++i) checkExtent(out, s[i], axes[i]);
    uint64_t along = 0;
    bool after = false;
    for (const Val* in : e->inputs()) {
      if (!in->isTensor()) continue;
      recordInput(in, axes);
      if (plan_.value(in).axes != rightAligned(in, shape(in), axes))
        reject(in->name() + " does not line up with " + out->name());
      along |= plan_.value(in).along;
      after = after || afterOuter(in);
    }
    record(out, axes, along, after);
  }

  void broadcastInDim(const Expr* e) {
    const Val* in = e->input(0);
    const auto& s = shape(e->out());
    if (static_cast<int>(s.size()) != rank()) reject("broadcast_in_dim to a rank other than F's");
    for (int d = 0; d < rank(); ++d) checkExtent(e->out(), s[d], d);
    const auto& dims = e->attrs().axes;
    std::vector<int> in_axes(dims.begin(), dims.end());
    if (!known(in)) {
      const auto& in_shape = shape(in);
      uint64_t along = 0;
      for (size_t i = 0; i < in_shape.size(); ++i) {
        checkExtent(in, in_shape[i], in_axes[i]);
        if (in_shape[i] == plan_.full_shape[in_axes[i]]) along |= uint64_t{1} << in_axes[i];
      }
      record(in, in_axes, along, false);
    }
    if (plan_.value(in).axes != in_axes) reject(in->name() + " is broadcast along axes it does not line up with");
    record(e->out(), identity(), plan_.value(in).along, afterOuter(in));
  }

  void reduction(const Expr* e) {
    const Val* in = e->input(0);
    recordInput(in, identity());
    const Plan::Value& v = plan_.value(in);
    if (v.axes != identity()) reject("the reduced " + in->name() + " does not line up with F");
    if (v.after_outer_reduction) reject(in->name() + " depends on an outer reduction");
    if (v.varies != Varies::PerElement) reject("the reduced " + in->name() + " does not vary per element");
    const std::vector<int64_t>& axes = e->attrs().axes;
    std::vector<int> out_axes;
    uint64_t along = v.along;
    for (int d = 0; d < rank(); ++d) {
      const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
      if (reduced) along &= ~(uint64_t{1} << d);
      if (!reduced || e->attrs().keepdim) out_axes.push_back(d);
    }
    const bool outer = std::find(outer_reductions_.begin(), outer_reductions_.end(), e) != outer_reductions_.end();
    record(e->out(), out_axes, along, outer);
  }

  void build() {
    for (const Expr* e : exprs_)
      if (!normalizationCandidate(e)) reject(toString(e->op()) + " cannot join a normalization segment");
    chooseIterationSpace();
    if (rank() > 63) reject("more than 63 axes");
    for (const Expr* e : exprs_) {
      for (const Val* v : e->outputs())
        if (!v->isTensor()) reject(toString(e->op()) + " has a scalar result");
      if (isReduction(e->op()))
        reduction(e);
      else if (e->op() == OpType::BroadcastInDim)
        broadcastInDim(e);
      else
        pointwise(e);
    }
    // What an epilogue value feeds must be an epilogue value too (it needs every row first).
    for (const Expr* e : exprs_) {
      const Plan::Value& out = plan_.value(e->out());
      for (const Val* in : e->inputs()) {
        if (!in->isTensor() || !afterOuter(in)) continue;
        if (out.varies != Varies::PerColumn && out.varies != Varies::Nothing)
          reject(e->out()->name() + " needs the outer reduction " + in->name() + " inside the row loop");
        if (isReduction(e->op())) reject("a reduction of an outer reduction's result");
      }
    }
    for (const auto& [v, info] : plan_.values)
      if (!isFloatingPoint(v->dtype()) && v->dtype() != DataType::Bool)
        reject(v->name() + " is " + toString(v->dtype()) + ": normalization kernels compute in floating point");
  }

  const std::vector<const Expr*>& exprs_;
  const ShapeMap& shapes_;
  Plan plan_;
  std::vector<const Expr*> outer_reductions_;
};

}  // namespace

std::optional<NormalizationPlan> planNormalization(const std::vector<const Expr*>& exprs, const ShapeMap& shapes,
                                                   std::string* why) {
  std::string reason;
  auto plan = Planner(exprs, shapes).run(reason);
  if (why) *why = reason;
  return plan;
}

}  // namespace meshfuse

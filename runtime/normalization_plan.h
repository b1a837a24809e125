// The shape of a normalization segment, shared by the lowering (which asks whether a run of exprs
// can be one: canScheduleNormalization) and the schedulers of every device (which run it).
//
// A normalization segment iterates over one "full" local shape F, whose axes split into outer axes
// [0, split) (the rows) and inner axes [split, rank) (a row). Its reductions all reduce either the
// inner axes (inner reductions: LayerNorm's mean and variance, softmax's max and sum) or the outer
// axes (outer reductions: LayerNorm's weight and bias gradients), and every other value is an
// elementwise function of values that line up with F. Each value then varies per element, per row,
// per column or not at all, which is all a kernel needs to keep a row in registers or cache,
// reduce it, and broadcast the results back over it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/segment.h"

namespace meshfuse {

struct NormalizationPlan {
  enum class Varies : uint8_t { Nothing, PerRow, PerColumn, PerElement };
  struct Value {
    // For each axis of the value, the axis of F it lines up with (numpy's right alignment, or
    // broadcast_in_dim's dims).
    std::vector<int> axes;
    // The F axes along which the value changes (bit f): not those where it has extent 1 or was
    // broadcast, nor the ones a reduction removed.
    uint64_t along = 0;
    Varies varies = Varies::Nothing;
    // Computed from an outer reduction's result: known only after every row (an epilogue value).
    bool after_outer_reduction = false;
  };
  std::vector<int64_t> full_shape;
  int split = 0;
  int64_t rows = 1, row_length = 1;
  bool has_inner_reduction = false, has_outer_reduction = false;
  std::unordered_map<const Val*, Value> values;  // every tensor the segment reads or computes

  const Value& value(const Val* v) const;
};

// The plan of `exprs` (topological order) at the local shapes `shapes`, or nullopt with the reason
// in `why` (when given) if they do not form a normalization segment.
std::optional<NormalizationPlan> planNormalization(const std::vector<const Expr*>& exprs, const ShapeMap& shapes,
                                                   std::string* why = nullptr);

// Whether an expr may belong to a normalization segment at all (pointwise, reduction,
// broadcast_in_dim; no random ops, whose element indices a row kernel does not track).
bool normalizationCandidate(const Expr* e);

}  // namespace meshfuse

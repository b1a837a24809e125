// Output shape of an op from its input shapes. The same rules serve definition time (extents may
// be -1, unknown) and execution time (every extent bound), so errors read the same in both.
#pragma once
#include <cstdint>
#include <vector>

#include "ir/ir.h"

namespace meshfuse {

// `shapes[i]` is input i's shape (empty for a scalar). Throws UserError naming the tensors.
std::vector<int64_t> inferShape(OpType op, const ExprAttributes& attrs, const std::vector<Val*>& inputs,
                                const std::vector<std::vector<int64_t>>& shapes);

// Every output's shape of `e` (exprs such as sdpfa_fwd have several), from its inputs' shapes.
std::vector<std::vector<int64_t>> inferShapes(const Expr* e, const std::vector<std::vector<int64_t>>& shapes);

// Normalizes possibly negative axes against `rank`, rejecting duplicates and out-of-range ones.
std::vector<int64_t> normalizeAxes(const std::vector<int64_t>& axes, int64_t rank, const std::string& what);

}  // namespace meshfuse

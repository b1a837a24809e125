// How the logical axes of an expr's inputs correspond to its output's axes. Sharding propagation
// and resharding insertion use it: an input sharded on an axis that maps to output axis b makes the
// output sharded on b; an input sharded on a reduced (or contracted) axis makes the output Partial.
#pragma once
#include <vector>

#include "ir/ir.h"

namespace meshfuse {

constexpr int kReducedAxis = -2;  // summed or contracted away by the expr
constexpr int kNoAxis = -3;       // no single output axis corresponds (e.g. inner axes of a reshape)

// For tensor input `i` of `e`: entry a is the output axis that input axis a becomes, or one of the
// constants above.
std::vector<int> inputToOutputAxes(const Expr* e, size_t i);

// The input axis of tensor input `i` that becomes output axis `b`, or -1.
int inputAxisFor(const Expr* e, size_t i, int b);

}  // namespace meshfuse

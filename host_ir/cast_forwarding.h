// Widening casts of a segment's inputs are recomputed by the segments that read them instead of
// being written out: a bf16 tensor read again and cast in the consumer costs half the bytes of the
// fp32 copy the producer would write and the consumer would read back (the bf16 GPT-3 backward
// wrote 400 MB of fp32 fc1 activations in a segment of its own, 0.24 ms on the H100, for one
// consumer). nvFuser forwards such casts of fusion inputs in the same spirit.
#pragma once
#include "host_ir/host_ir.h"
#include "ir/ir.h"

namespace meshfuse {

// For every cast in a pointwise or normalization segment whose operand comes from outside that
// segment and whose result is wider than its operand: when every reader of the result in another
// segment is a pointwise or normalization segment that can take the cast (same shape; a plannable
// normalization), the cast is copied to the front of each such segment, and removed from its own
// segment when nothing there reads it (a segment left empty is removed from the program). Runs
// before segment inputs and outputs are collected (HostIrLower::finishSegments).
void forwardWideningCasts(const Fusion& fusion, HostIrContainer& hic);

// Whether `value`, computed in segment `owner`, is read where it is not computed: by an expr of a
// segment that does not compute it too, by an instruction outside the segments, or as an output of
// the fusion. `segments_of` maps each expr to the segments it is in.
bool readOutsideItsSegments(const Fusion& fusion, const TensorView* value, const Segment& owner,
                            const std::unordered_map<const Expr*, std::vector<int>>& segments_of,
                            const std::vector<Segment>& segments);

// Sets `seg`'s inputs (inputsOf its exprs) and outputs (its exprs' results read outside it, as above).
void collectInputsAndOutputs(const Fusion& fusion, Segment& seg,
                             const std::unordered_map<const Expr*, std::vector<int>>& segments_of,
                             const std::vector<Segment>& segments);

// Each expr's segments, in order (a forwarded cast is in several).
std::unordered_map<const Expr*, std::vector<int>> segmentsOfExprs(const std::vector<Segment>& segments);

}  // namespace meshfuse

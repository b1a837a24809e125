// Views launched one after another run as one view segment. A view costs its executor next to
// nothing (a restride; a copy only for a reshape of a strided value or a cat), but each segment is a
// trip through the evaluator and the executor's setup: the transformer backward launched 39 view
// segments, 1-3 us of host time each on the H100's host, mostly in runs (the heads split before
// attention, the gradients merged after it).
#pragma once
#include "host_ir/host_ir.h"
#include "ir/ir.h"

namespace meshfuse {

// Merges each run of consecutive LaunchSegment instructions of view segments into the run's first
// segment (exprs in program order, so in dependency order); its inputs and outputs are collected
// again (a value read only by views of the run is no longer an output). Runs after waits are placed
// (host_ir/wait_placement.h), so a merged run starts where its first view was placed and no wait
// moves: a view held back behind a communication stays behind it.
void mergeAdjacentViews(const Fusion& fusion, HostIrContainer& hic);

}  // namespace meshfuse

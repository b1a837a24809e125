// Where a host program waits for its communications. A communication is posted where its input is
// ready and waited for only where its result is first needed, so that the compute in between runs
// while the data moves: in the tensor-parallel backward, the allreduce of an input-gradient GEMM
// runs beside the weight-gradient GEMM that follows it (Megatron's overlap), and on a CPU, where
// MPI progresses only inside its calls, a rank that is ahead does that GEMM instead of waiting at
// the post for a slower peer.
#pragma once
#include "host_ir/host_ir.h"

namespace meshfuse {

// Inserts a Wait before the first instruction that needs each posted communication's result, and
// any remaining ones at the end. A view segment (a reshape or permute of the result: metadata, no
// work) does not count as needing it: such views are held back, in order, until an instruction
// that is not such a view reads what they produce, so that a reshape right after a communication
// does not pin its wait there. Everything else keeps its order; posts keep theirs, which every rank
// shares.
void placeWaits(HostIrContainer& hic);

}  // namespace meshfuse

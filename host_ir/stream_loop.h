// Runs a StreamLoop (host_ir.h): the chunked, pipelined allgather -> matmul or matmul ->
// reduce-scatter. Up to `number_of_streams` chunk communications are in flight while the
// executor computes another chunk's matmul.
#pragma once
#include "host_ir/fusion_executor.h"
#include "host_ir/host_ir.h"
#include "host_ir/trace.h"

namespace meshfuse {

void runStreamLoop(const HostIrContainer& hic, const StreamLoop& loop, ValueMap& values, SegmentExecutor& executor,
                   const HostIrEvaluatorParams& params, Tracer* tracer);

}  // namespace meshfuse

// HostIrEvaluator: runs one rank's HostIrContainer. Segments go to the segment executor;
// communications are posted on their backend and waited for just before their result is first
// read, so independent compute overlaps them.
#pragma once
#include "host_ir/fusion_executor.h"
#include "host_ir/host_ir.h"
#include "host_ir/trace.h"
#include "runtime/segment.h"

namespace meshfuse {

class HostIrEvaluator {
 public:
  HostIrEvaluator(const HostIrContainer& hic, HostIrEvaluatorParams params, SegmentExecutor& executor,
                  Tracer* tracer = nullptr)
      : hic_(hic), params_(std::move(params)), executor_(executor), tracer_(tracer) {}
  // `values` holds the program's inputs; on return it also holds every value this rank computed.
  void run(ValueMap& values);

 private:
  const HostIrContainer& hic_;
  HostIrEvaluatorParams params_;
  SegmentExecutor& executor_;
  Tracer* tracer_;
};

}  // namespace meshfuse

// The design's executor for C++ users (docs/design.md, "Names users see"): one fusion, the
// communicator and the parameters fixed at construction, run with each rank's inputs, as nvFuser's
// MultiDeviceExecutor is. It is a FusionExecutorCache underneath (one lowered program per input
// signature, the same checks and agreement), which front ends that pass parameters per call use
// directly.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "host_ir/fusion_executor.h"
#include "multidevice/communicator.h"

namespace meshfuse {

class MultiDeviceExecutor {
 public:
  // `communicator` is the process's world, Communicator::instance() (the only one there is: lowering,
  // the input agreement and the backends run on it).
  MultiDeviceExecutor(std::shared_ptr<Fusion> fusion, Communicator& communicator,
                      const MultiDeviceExecutorParams& params = {});

  // One tensor per fusion output, undefined where that output does not live on this rank. Every rank
  // of the fusion's meshes calls it with its own shards (global shapes bound from them).
  std::vector<Tensor> runWithInput(const std::vector<Argument>& inputs);

  const MultiDeviceExecutorParams& params() const { return params_; }
  Communicator& communicator() const { return communicator_; }
  // This rank's host program of the last run ("" before the first), and the fusion after sharding
  // propagation and resharding insertion.
  std::string hostIr() const { return cache_.lastHostIr(); }
  std::string loweredFusion() const { return cache_.lastLoweredFusion(); }

 private:
  FusionExecutorCache cache_;
  Communicator& communicator_;
  MultiDeviceExecutorParams params_;
};

}  // namespace meshfuse

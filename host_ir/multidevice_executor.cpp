#include "host_ir/multidevice_executor.h"

#include <utility>

namespace meshfuse {

MultiDeviceExecutor::MultiDeviceExecutor(std::shared_ptr<Fusion> fusion, Communicator& communicator,
                                         const MultiDeviceExecutorParams& params)
    : cache_(std::move(fusion)), communicator_(communicator), params_(params) {}

std::vector<Tensor> MultiDeviceExecutor::runWithInput(const std::vector<Argument>& inputs) {
  return cache_.execute(inputs, params_);
}

}  // namespace meshfuse

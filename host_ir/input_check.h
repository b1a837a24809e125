// Checks execute()'s inputs against the definition on this rank, and (multi-device) agrees on them
// with every other rank before any communication: a rank with bad input raises its own error and
// every other rank raises one naming it, instead of waiting forever in a collective.
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "host_ir/fusion_executor.h"
#include "host_ir/lower.h"

namespace meshfuse {

struct InputSignature {
  std::vector<bool> present;  // whether this rank holds input i
  std::vector<DataType> dtypes;
  std::vector<std::vector<int64_t>> global;  // global shapes (empty for scalars)
  DeviceType device = DeviceType::CPU;
  int device_index = 0;
};

// Throws UserError naming the tensor and expected vs actual value.
InputSignature checkLocalInputs(const Fusion& fusion, const std::vector<Argument>& inputs, int64_t rank);

// Exchanges every rank's verdict (an error message or its signature) over the world. Throws
// UserError on every rank if any rank failed, naming it; fills the global shapes of inputs this
// rank does not hold from the ranks that do, and checks that all ranks agree.
InputSignature agreeOnInputs(const Fusion& fusion, const InputSignature* mine, const std::string& my_error,
                             std::chrono::milliseconds timeout);

}  // namespace meshfuse

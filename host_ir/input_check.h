// Checks execute()'s inputs against the definition on this rank, and (multi-device) agrees on them
// with every other rank before any communication: a rank with bad input raises its own error and
// every other rank raises one naming it, instead of waiting forever in a collective.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "host_ir/fusion_executor.h"
#include "host_ir/lower.h"

namespace meshfuse {

// The seed of uniform/normal/dropout draws without one of their own, when MESHFUSE_SEED is unset.
constexpr uint64_t kDefaultRandomSeed = 0x6d657368;

struct InputSignature {
  std::vector<bool> present;  // whether this rank holds input i
  std::vector<DataType> dtypes;
  std::vector<std::vector<int64_t>> global;  // global shapes (empty for scalars)
  std::vector<double> scalars;               // a scalar input's value (0 for tensors): replicated, so agreed
  // MESHFUSE_CHECK_REPLICAS=1: per input, a hash of this rank's data where other ranks hold a replica
  // of the same block (a CPU tensor not sharded along some mesh dim of more than one device); else 0.
  std::vector<uint64_t> replica_hashes;
  DeviceType device = DeviceType::CPU;
  int device_index = 0;
  // Not inputs, but what every rank must share for the execution to be one program (agreed with them):
  bool trace = false;             // a trace was asked for (its file is gathered from every rank)
  uint64_t rng_seed = 0;          // MESHFUSE_SEED
  uint64_t rng_offset = 0;        // the next fresh Philox offset; agreement makes it the largest of the ranks'
  int64_t given_rng_offset = -1;  // HostIrEvaluatorParams::rng_offset; agreement takes the largest
  // A hash of what this rank is about to run (definitionLines): a rank executing another fusion, or
  // the same with other parameters, would run its cached program against the others' collectives.
  uint64_t definition = 0;
};

// The rank-independent text of a definition and the parameters that shape its program, one line
// each: the fusion (ops, meshes, loop domains), the backend asked for and the stream count.
std::vector<std::string> definitionLines(const Fusion& fusion, const MultiDeviceExecutorParams& params);

// Every value an expression reads or the fusion returns is an input, a constant or computed by an
// expression: a tensor or scalar made with newTensor/newScalar and never added as an input has no
// value to run with (it failed deep in the executor, as an internal error). Throws UserError naming
// it. A property of the definition: the executor checks it once per fusion version.
void checkEveryLeafIsBound(const Fusion& fusion);

// Throws UserError naming the tensor and expected vs actual value.
InputSignature checkLocalInputs(const Fusion& fusion, const std::vector<Argument>& inputs, int64_t rank);

// Exchanges every rank's verdict (an error message or its signature) over the world. Throws
// UserError on every rank if any rank failed, naming it; fills the global shapes of inputs this
// rank does not hold from the ranks that do, and checks that all ranks agree (on the definition they
// execute, on the shapes, on whether to trace and on the random seed); the result's rng_offset is the
// largest rank's. When the definitions differ (their hashes), every rank compares `definition_lines`
// (the lines of its definition) to name the first that differs, and raises.
InputSignature agreeOnInputs(const Fusion& fusion, const InputSignature* mine, const std::string& my_error,
                             std::chrono::milliseconds timeout, const std::vector<std::string>& definition_lines = {});

}  // namespace meshfuse

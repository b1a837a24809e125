// The entry point of execution: FusionExecutorCache takes a definition, and for each distinct
// input signature (shapes, dtypes, devices) and lowering parameters it lowers once to a per-rank
// host program and caches it; a second execute with the same signature does no lowering work.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "backends/backend.h"
#include "ir/ir.h"
#include "runtime/tensor.h"

namespace meshfuse {

struct HostIrLowerParams {
  CommunicatorBackend communicator_backend = CommunicatorBackend::Auto;
};

struct HostIrEvaluatorParams {
  int64_t number_of_streams = 4;
  // Multiprocessors each matmul of a stream loop leaves free on a CUDA device (cuBLASLt's SM count
  // target), so that communication kernels (NCCL, device-to-device copies) run beside it instead
  // of queueing behind it; -1: env MESHFUSE_OVERLAP_SM_MARGIN, else 0 (every multiprocessor).
  int64_t overlap_sm_margin = -1;
  // Deadline of every wait on a communication (env MESHFUSE_TIMEOUT, in seconds, overrides).
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  std::string trace_path;  // when set, a Chrome trace JSON of the execution is written there
  // What a trace's segment spans measure. false (default): device time, each segment synchronized
  // (the GPU's work per segment, not overlapped with the host). true (or env MESHFUSE_TRACE_HOST=1):
  // the host's time to launch each segment, nothing synchronized, so the trace shows where a pass
  // whose GPU waits on its host spends the host's time (category "host"; stream loops as one span).
  bool trace_host = false;
  // >= 0: the Philox offset of this execution's first fresh random draw (uniform/normal/dropout
  // without an rng_seed; the k-th draws at rng_offset + k) instead of the process's counter, so that
  // a recomputation draws the same masks (activation checkpointing: meshfuse.torch takes it from
  // torch's generator, whose state checkpoint restores). The ranks agree on the largest they pass
  // (each passes one, or none does). Below 2**53. -1: the counter.
  int64_t rng_offset = -1;
};

struct MultiDeviceExecutorParams {
  HostIrLowerParams lower;
  HostIrEvaluatorParams executor;
};

// One input of execute(): a tensor, a scalar, or none (an input whose mesh excludes this rank).
using Argument = std::variant<std::monostate, Tensor, double>;

class HostIrContainer;

class FusionExecutorCache {
 public:
  explicit FusionExecutorCache(std::shared_ptr<Fusion> fusion);
  ~FusionExecutorCache();
  // One tensor per fusion output, undefined where that output does not live on this rank.
  // Executions of multi-rank fusions run one at a time in a process (their collectives share the
  // world, so threads would interleave them differently on each rank), and every rank must call
  // them in the same order: ranks executing different definitions at one step raise on every rank.
  std::vector<Tensor> execute(const std::vector<Argument>& inputs, const MultiDeviceExecutorParams& params = {});
  // For front ends that check inputs before calling execute(): a rank whose inputs failed such a
  // check calls this instead, so the other ranks (waiting in execute's input agreement) fail too,
  // with a message naming this rank, instead of waiting for it. Throws UserError(error) here.
  void reportInputError(const std::string& error, const MultiDeviceExecutorParams& params = {});
  // The host program (this rank's) of the last execution, or "" before the first.
  std::string lastHostIr() const;
  // The fusion after sharding propagation and resharding insertion, of the last execution.
  std::string lastLoweredFusion() const;
  // Where the last execution's outputs live: a new Fusion whose outputs are definition-less copies of
  // them, in order, each with the mesh and loop domain sharding propagation gave it and its global
  // extents as the inputs bound them (a front end hands them to shard_tensor / gather_tensor). Null
  // before the first execution.
  std::shared_ptr<Fusion> lastOutputShardings() const;
  size_t numCachedPrograms() const { return programs_.size(); }
  const Fusion& fusion() const { return *fusion_; }

 private:
  struct Program;
  // The hash of definitionLines (input_check.h) for this fusion and `params`, recomputed only when
  // the fusion's version or the parameters changed.
  uint64_t definitionHash(const MultiDeviceExecutorParams& params);
  // checkEveryLeafIsBound (input_check.h), once per fusion version.
  void checkLeavesOnce();
  std::shared_ptr<Fusion> fusion_;
  std::map<std::string, std::shared_ptr<Program>> programs_;
  std::shared_ptr<Program> last_;
  // The definition's lines and hash as the ranks agree on them each execution (input_check.h),
  // kept until the fusion's version or the parameters change.
  // (fusion version, backend asked for, stream count): what the lines are of; none before the first.
  using DefinitionKey = std::tuple<uint64_t, CommunicatorBackend, int64_t>;
  std::optional<DefinitionKey> definition_key_;
  std::vector<std::string> definition_lines_;
  uint64_t definition_hash_ = 0;
  uint64_t leaves_checked_version_ = UINT64_MAX;
};

}  // namespace meshfuse

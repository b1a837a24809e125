#include "host_ir/fusion_executor.h"

#include <cstdlib>
#include <sstream>

#include "host_ir/consistency.h"
#include "host_ir/evaluator.h"
#include "host_ir/input_check.h"
#include "host_ir/lower.h"
#include "host_ir/timeout_policy.h"
#include "multidevice/communicator.h"
#include "multidevice/debug_log.h"
#include "multidevice/resharding.h"
#include "runtime/segment.h"

namespace meshfuse {

struct FusionExecutorCache::Program {
  ReshardedFusion resharded;
  std::unique_ptr<HostIrContainer> hic;
  std::unique_ptr<SegmentExecutor> executor;
};

namespace {
std::chrono::milliseconds effectiveTimeout(const HostIrEvaluatorParams& params) {
  if (const char* env = std::getenv("MESHFUSE_TIMEOUT")) {
    char* end = nullptr;
    double seconds = std::strtod(env, &end);
    if (end != env && seconds > 0) return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  }
  return params.timeout;
}

void checkMeshesFitWorld(const Fusion& fusion, int64_t world_size) {
  for (const auto& v : fusion.vals()) {
    if (!v->isTensor()) continue;
    auto* tv = static_cast<const TensorView*>(v.get());
    if (tv->hasDeviceMesh() && tv->deviceMesh()->maxDevice() >= world_size)
      throw UserError(tv->name() + ": " + tv->deviceMesh()->toString() + " names device " +
                      std::to_string(tv->deviceMesh()->maxDevice()) + " but the world has " +
                      std::to_string(world_size) + " process(es); launch with mpirun -np " +
                      std::to_string(tv->deviceMesh()->maxDevice() + 1) + " or more");
  }
}

std::string cacheKey(const InputSignature& sig, const MultiDeviceExecutorParams& params) {
  std::ostringstream os;
  os << static_cast<int>(params.lower.communicator_backend) << "|" << static_cast<int>(sig.device) << ":"
     << sig.device_index << "|";
  for (size_t i = 0; i < sig.global.size(); ++i) {
    os << static_cast<int>(sig.dtypes[i]) << "[";
    for (int64_t e : sig.global[i]) os << e << ",";
    os << "]";
  }
  return os.str();
}

std::unique_ptr<SegmentExecutor> executorFor(Device device) {
  if (device.type == DeviceType::CPU) return makeCpuExecutor();
  if (makeCudaExecutor == nullptr)
    throw UserError("inputs are on " + device.toString() + " but meshfuse was built without CUDA");
  return makeCudaExecutor(device.index);
}
}  // namespace

FusionExecutorCache::FusionExecutorCache(std::shared_ptr<Fusion> fusion) : fusion_(std::move(fusion)) {
  if (fusion_->outputs().empty()) throw UserError("the fusion has no outputs (call add_output)");
}

FusionExecutorCache::~FusionExecutorCache() = default;

std::vector<Tensor> FusionExecutorCache::execute(const std::vector<Argument>& inputs,
                                                 const MultiDeviceExecutorParams& params) {
  const bool multi = isMultiDevice(*fusion_);
  Communicator* comm = multi ? &Communicator::instance() : nullptr;
  const int64_t rank = comm ? comm->rank() : 0;
  const auto timeout = effectiveTimeout(params.executor);

  InputSignature sig;
  if (multi && comm->size() > 1) {
    // Every rank reaches the agreement with a verdict, so none is left waiting in a collective.
    std::string error;
    try {
      checkMeshesFitWorld(*fusion_, comm->size());
      sig = checkLocalInputs(*fusion_, inputs, rank);
    } catch (const UserError& e) {
      error = e.what();
    }
    sig = withTimeoutPolicy("in execute's input agreement over the world (backend mpi)",
                            [&] { return agreeOnInputs(*fusion_, error.empty() ? &sig : nullptr, error, timeout); });
  } else {
    if (multi) checkMeshesFitWorld(*fusion_, comm->size());
    sig = checkLocalInputs(*fusion_, inputs, rank);
  }

  std::string key = cacheKey(sig, params);
  auto it = programs_.find(key);
  if (it == programs_.end()) {
    auto program = std::make_shared<Program>();
    program->resharded = insertResharding(*fusion_);
    const Fusion& lowered = *program->resharded.fusion;
    GlobalShapes input_shapes;
    for (size_t i = 0; i < lowered.inputs().size(); ++i)
      if (lowered.inputs()[i]->isTensor()) input_shapes[lowered.inputs()[i]] = sig.global[i];
    GlobalShapes shapes = bindShapes(lowered, input_shapes);
    Device device{sig.device, sig.device_index};
    program->hic = HostIrLower(params.lower).lower(lowered, shapes, rank, device);
    program->executor = executorFor(device);
    if (debug::enabled(debug::Level::Info)) debug::info("lowered a new host program:\n" + program->hic->toString());
    // Before its first communication the ranks check that they lowered the same program (once per
    // cached program); on a mismatch nothing is cached and every rank raises.
    if (multi && comm->size() > 1) checkNewProgramAgrees(lowered, sig, params, device, timeout);
    it = programs_.emplace(key, std::move(program)).first;
  }
  last_ = it->second;
  Program& program = *it->second;
  const Fusion& lowered = *program.resharded.fusion;

  ValueMap values;
  for (size_t i = 0; i < lowered.inputs().size(); ++i) {
    const Val* v = lowered.inputs()[i];
    if (!v->isTensor())
      values.scalars[v] = std::get<double>(inputs[i]);
    else if (sig.present[i] && std::holds_alternative<Tensor>(inputs[i]))
      values.tensors[v] = std::get<Tensor>(inputs[i]);
  }
  HostIrEvaluatorParams eval_params = params.executor;
  eval_params.timeout = timeout;
  withTimeoutPolicy("while running the host program",
                    [&] { HostIrEvaluator(*program.hic, eval_params, *program.executor).run(values); });

  std::vector<Tensor> outputs;
  for (const Val* out : lowered.outputs()) {
    auto found = values.tensors.find(out);
    outputs.push_back(found == values.tensors.end() ? Tensor() : found->second);
  }
  return outputs;
}

std::string FusionExecutorCache::lastHostIr() const { return last_ ? last_->hic->toString() : ""; }

std::string FusionExecutorCache::lastLoweredFusion() const { return last_ ? last_->resharded.fusion->toString() : ""; }

}  // namespace meshfuse

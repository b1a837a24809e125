#include "host_ir/fusion_executor.h"

#include <cstdlib>
#include <sstream>

#include "host_ir/consistency.h"
#include "host_ir/evaluator.h"
#include "host_ir/input_check.h"
#include "host_ir/lower.h"
#include "host_ir/timeout_policy.h"
#include "host_ir/trace.h"
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

// Rank 0 writes one trace with every rank's events (pid = rank).
void writeTraceFromAllRanks(const Tracer& tracer, const std::string& path, Communicator* comm,
                            std::chrono::milliseconds timeout) {
  std::string mine = tracer.toJsonEvents(comm ? comm->rank() : 0);
  if (!comm || comm->size() == 1) {
    writeTrace(path, {mine});
    return;
  }
  std::vector<int64_t> world(comm->size());
  for (int64_t r = 0; r < comm->size(); ++r) world[r] = r;
  // Equal-size contributions: agree on the longest, pad with spaces (valid JSON whitespace).
  std::string len = std::to_string(mine.size());
  len.resize(32, ' ');
  size_t longest = 0;
  for (const std::string& l : comm->allgatherBytes(world, len, timeout)) longest = std::max(longest, std::stoul(l));
  mine.resize(longest, ' ');
  std::vector<std::string> all = comm->allgatherBytes(world, mine, timeout);
  if (comm->rank() == 0) writeTrace(path, all);
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
    {  // The user's shardings, checked on the definition itself: resharding re-derives loop domains
       // from shardings, so a bad split of a non-input tensor would otherwise pass unnoticed.
      GlobalShapes user_inputs;
      for (size_t i = 0; i < fusion_->inputs().size(); ++i)
        if (fusion_->inputs()[i]->isTensor()) user_inputs[fusion_->inputs()[i]] = sig.global[i];
      bindShapes(*fusion_, user_inputs);
    }
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
    // The ranks agree on the program, hence on its backend: one that needs a world-collective
    // first step (UCC's context) takes it here, where every rank is.
    if (multi && comm->size() > 1)
      withTimeoutPolicy("preparing the communication backend over the world",
                        [&] { comm->prepare(comm->resolve(params.lower.communicator_backend, device), timeout); });
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
  program.hic->number_of_streams = eval_params.number_of_streams;
  std::string trace_path = eval_params.trace_path;
  if (const char* env = std::getenv("MESHFUSE_TRACE"); trace_path.empty() && env) trace_path = env;
  if (!trace_path.empty() && multi && comm->size() > 1) comm->barrier();  // one time origin for all ranks
  std::unique_ptr<Tracer> tracer = trace_path.empty() ? nullptr : std::make_unique<Tracer>();
  withTimeoutPolicy("while running the host program",
                    [&] { HostIrEvaluator(*program.hic, eval_params, *program.executor, tracer.get()).run(values); });
  if (tracer) writeTraceFromAllRanks(*tracer, trace_path, multi ? comm : nullptr, timeout);

  std::vector<Tensor> outputs;
  for (const Val* out : lowered.outputs()) {
    auto found = values.tensors.find(out);
    outputs.push_back(found == values.tensors.end() ? Tensor() : found->second);
  }
  return outputs;
}

void FusionExecutorCache::reportInputError(const std::string& error, const MultiDeviceExecutorParams& params) {
  if (isMultiDevice(*fusion_) && Communicator::instance().size() > 1) {
    const auto timeout = effectiveTimeout(params.executor);
    withTimeoutPolicy("in execute's input agreement over the world (backend mpi)",
                      [&] { return agreeOnInputs(*fusion_, nullptr, error, timeout); });
  }
  throw UserError(error);
}

std::string FusionExecutorCache::lastHostIr() const { return last_ ? last_->hic->toString() : ""; }

std::string FusionExecutorCache::lastLoweredFusion() const { return last_ ? last_->resharded.fusion->toString() : ""; }

}  // namespace meshfuse

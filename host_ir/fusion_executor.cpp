#include "host_ir/fusion_executor.h"

#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
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
#include "multidevice/timeout_env.h"
#include "runtime/element.h"
#include "runtime/segment.h"

namespace meshfuse {

struct FusionExecutorCache::Program {
  ReshardedFusion resharded;
  std::vector<std::vector<int64_t>> output_shapes;  // global, symbolic extents bound (tensors; {} for scalars)
  std::unique_ptr<HostIrContainer> hic;
  std::unique_ptr<SegmentExecutor> executor;
};

namespace {
// MESHFUSE_TIMEOUT (multidevice/timeout_env.h) overrides the parameters' timeout. A value that is
// not a positive number is an error (it used to be ignored, leaving the user's intended limit
// unenforced): `error` says so, for execute to raise on every rank through its input agreement,
// which meanwhile runs under the parameters' timeout.
struct TimeoutSetting {
  std::chrono::milliseconds timeout;
  std::string error;
};

TimeoutSetting effectiveTimeout(const HostIrEvaluatorParams& params) {
  EnvTimeout env = timeoutFromEnvironment();
  return {env.value.value_or(params.timeout), env.error};
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

// Held through each multi-rank execution (fusion_executor.h says why).
std::mutex& worldExecuteMutex() {
  static std::mutex turn;
  return turn;
}

// The fusion's version is part of the key: the lowering reads the meshes and shardings, which can
// still change after an execute (TensorView.set_device_mesh, outer_split, parallelize).
std::string cacheKey(const InputSignature& sig, const MultiDeviceExecutorParams& params, uint64_t fusion_version) {
  std::ostringstream os;
  os << "v" << fusion_version << "|" << static_cast<int>(params.lower.communicator_backend) << "|"
     << static_cast<int>(sig.device) << ":" << sig.device_index << "|";
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

// uniform()/normal() without an rng_seed draw from (seed, offset) pairs that differ at every
// execution and agree across ranks, so that sharded random tensors stay blocks of one global tensor
// and replicated ones (dropout masks) are equal: a process-wide counter advanced per random op and
// execution. A rank can run a fusion of its own that draws, which moves only its counter, so every
// multi-rank execution first agrees on the counter (the largest rank's, in execute's input
// agreement) and all ranks go on from there. MESHFUSE_SEED sets the seed (default fixed, so runs are
// reproducible); the ranks check that theirs agree.
std::atomic<uint64_t>& nextRandomOffset() {
  static std::atomic<uint64_t> next{0};
  return next;
}

// Read at each execution (a lookup in the environment), so that a process may change it between runs.
// Digits only, below 2**53 (seeds travel as doubles); anything else is an error (it used to be read as
// whatever strtoull made of it: "abc" as 0, "1.5" as 1), raised by execute on every rank.
struct SeedSetting {
  uint64_t seed = kDefaultRandomSeed;
  std::string error;
};

SeedSetting randomSeedSetting() {
  const char* env = std::getenv("MESHFUSE_SEED");
  if (env == nullptr || *env == '\0') return {};
  const std::string text(env);
  const bool digits = text.find_first_not_of("0123456789") == std::string::npos && text.size() <= 16;
  const uint64_t value = digits ? std::stoull(text) : 0;
  if (!digits || value >= (uint64_t{1} << 53))
    return {kDefaultRandomSeed, "MESHFUSE_SEED=" + text + ": expected a non-negative integer below 2**53"};
  return {value, ""};
}

void advanceRandomOffsetTo(uint64_t agreed) {
  std::atomic<uint64_t>& next = nextRandomOffset();
  uint64_t current = next.load();
  while (current < agreed && !next.compare_exchange_weak(current, agreed)) {
  }
}

// given_offset >= 0 (HostIrEvaluatorParams::rng_offset): the k-th fresh draw takes given_offset + k,
// and the process's counter is left alone.
void bindFreshRandomState(const Fusion& lowered, ValueMap& values, uint64_t seed, int64_t given_offset) {
  uint64_t k = 0;
  for (const auto& e : lowered.exprs()) {
    if (!e->attrs().fresh_rng) continue;
    // The pair is the expr's last two operands (uniform/normal, sdpfa_fwd).
    const size_t n = e->inputs().size();
    values.scalars[e->input(n - 2)] = static_cast<double>(seed);
    const uint64_t offset =
        given_offset >= 0 ? static_cast<uint64_t>(given_offset) + k++ : nextRandomOffset().fetch_add(1);
    values.scalars[e->input(n - 1)] = static_cast<double>(offset);
  }
}

// A set makes a copy (README), but where its communication is the identity (a rank in both meshes of a
// move, a mesh dim of one device) or a local slice, the evaluator passes the tensor on as it is: the
// output was the caller's own input array (writable), or another output. Copied then; a view op's
// output (reshape, permute, slice) shares its input's memory as documented, and is left alone.
void copyIfAliased(const Val* out, const std::vector<Argument>& inputs, std::vector<Tensor>& outputs) {
  Tensor& mine = outputs.back();
  const Expr* def = out->definition();
  if (!mine.storage() || def == nullptr || def->op() != OpType::Set) return;
  bool aliased = std::any_of(inputs.begin(), inputs.end(), [&](const Argument& a) {
    return std::holds_alternative<Tensor>(a) && std::get<Tensor>(a).storage() == mine.storage();
  });
  for (size_t k = 0; k + 1 < outputs.size() && !aliased; ++k) aliased = outputs[k].storage() == mine.storage();
  if (aliased) mine = mine.clone();
}

std::unique_ptr<SegmentExecutor> executorFor(Device device) {
  if (device.type == DeviceType::CPU) return makeCpuExecutor();
  if (makeCudaExecutor == nullptr)
    throw UserError("inputs are on " + device.toString() + " but meshfuse was built without CUDA");
  return makeCudaExecutor(device.index);
}
}  // namespace

FusionExecutorCache::FusionExecutorCache(std::shared_ptr<Fusion> fusion) : fusion_(std::move(fusion)) {
  if (!fusion_) throw UserError("FusionExecutorCache: expected a Fusion, got null");
  if (fusion_->outputs().empty()) throw UserError("the fusion has no outputs (call add_output)");
}

FusionExecutorCache::~FusionExecutorCache() = default;

std::vector<Tensor> FusionExecutorCache::execute(const std::vector<Argument>& inputs,
                                                 const MultiDeviceExecutorParams& params) {
  const bool multi = isMultiDevice(*fusion_);
  Communicator* comm = multi ? &Communicator::instance() : nullptr;
  const int64_t rank = comm ? comm->rank() : 0;
  const TimeoutSetting timeout_setting = effectiveTimeout(params.executor);
  const auto timeout = timeout_setting.timeout;
  const SeedSetting seed_setting = randomSeedSetting();  // read once: the agreement and the binding use it
  std::string trace_path = params.executor.trace_path;
  if (const char* env = std::getenv("MESHFUSE_TRACE"); trace_path.empty() && env) trace_path = env;
  // This rank's settings from the environment and its trace path, checked before anything runs (in the
  // multi-rank case inside the agreement, so that every rank raises).
  auto checkSettings = [&] {
    if (!timeout_setting.error.empty()) throw UserError(timeout_setting.error);
    if (!seed_setting.error.empty()) throw UserError(seed_setting.error);
    if (params.executor.rng_offset < -1 || params.executor.rng_offset >= (int64_t{1} << 53))
      throw UserError("execute: rng_offset must be in [0, 2**53) (or -1: the process's counter), got " +
                      std::to_string(params.executor.rng_offset));
    if (!trace_path.empty() && rank == 0) checkTraceWritable(trace_path);  // rank 0 writes it
  };

  InputSignature sig;
  std::unique_lock<std::mutex> world_turn;
  if (multi && comm->size() > 1) {
    // After a timeout that did not end the job (MESHFUSE_ABORT_ON_TIMEOUT=0) a collective is left
    // half done: the next one would match against its leftovers (a retry crashed the job in MPI with
    // a truncation error). Refused on this rank alone; the others, if any are left, time out too.
    if (comm->broken())
      throw CommunicationTimeout(
          "execute: an earlier communication timed out on this rank, which leaves the world's "
          "collectives unusable (MESHFUSE_ABORT_ON_TIMEOUT=0 kept the process alive to report it): "
          "end this process; the job cannot go on");
    world_turn = std::unique_lock<std::mutex>(worldExecuteMutex());
    // Every rank reaches the agreement with a verdict, so none is left waiting in a collective.
    std::string error;
    try {
      checkSettings();
      checkMeshesFitWorld(*fusion_, comm->size());
      checkLeavesOnce();
      sig = checkLocalInputs(*fusion_, inputs, rank);
      sig.trace = !trace_path.empty();
      sig.rng_seed = seed_setting.seed;
      sig.rng_offset = nextRandomOffset().load();
      sig.given_rng_offset = params.executor.rng_offset;
      sig.definition = definitionHash(params);
    } catch (const UserError& e) {
      error = e.what();
    }
    sig = withTimeoutPolicy("in execute's input agreement over the world (backend mpi)", [&] {
      return agreeOnInputs(*fusion_, error.empty() ? &sig : nullptr, error, timeout, definition_lines_);
    });
    advanceRandomOffsetTo(sig.rng_offset);
  } else {
    checkSettings();
    if (multi) checkMeshesFitWorld(*fusion_, comm->size());
    checkLeavesOnce();
    sig = checkLocalInputs(*fusion_, inputs, rank);
    sig.given_rng_offset = params.executor.rng_offset;
  }

  std::string key = cacheKey(sig, params, fusion_->version());
  auto it = programs_.find(key);
  if (it == programs_.end()) {
    const Device device{sig.device, sig.device_index};
    auto lowerNew = [&] {
      auto program = std::make_shared<Program>();
      // The user's shardings, checked on the definition itself: resharding re-derives loop domains
      // from shardings, so a bad split of a non-input tensor would otherwise pass unnoticed. The
      // bound extents also tell resharding which symbolic extents broadcast.
      GlobalShapes user_inputs;
      for (size_t i = 0; i < fusion_->inputs().size(); ++i)
        if (fusion_->inputs()[i]->isTensor()) user_inputs[fusion_->inputs()[i]] = sig.global[i];
      ReshardingOptions resharding;
      resharding.float_half_products = device.type == DeviceType::CPU;
      program->resharded = insertResharding(*fusion_, bindShapes(*fusion_, user_inputs), resharding);
      const Fusion& lowered = *program->resharded.fusion;
      GlobalShapes input_shapes;
      for (size_t i = 0; i < lowered.inputs().size(); ++i)
        if (lowered.inputs()[i]->isTensor()) input_shapes[lowered.inputs()[i]] = sig.global[i];
      GlobalShapes shapes = bindShapes(lowered, input_shapes);
      for (const Val* out : lowered.outputs()) {
        auto found = shapes.find(out);
        program->output_shapes.push_back(found == shapes.end() ? std::vector<int64_t>{} : found->second);
      }
      program->hic = HostIrLower(params.lower).lower(lowered, shapes, rank, device);
      program->hic->number_of_streams = params.executor.number_of_streams;  // as the log below prints it
      program->executor = executorFor(device);
      if (debug::enabled(debug::Level::Info)) debug::info("lowered a new host program:\n" + program->hic->toString());
      return program;
    };
    std::shared_ptr<Program> program;
    if (multi && comm->size() > 1) {
      // Before its first communication the ranks check that they lowered the same program (once
      // per cached program); on a mismatch nothing is cached and every rank raises. A rank whose
      // lowering failed (a definition that differs per rank, say) joins the check with its error,
      // so the others raise at once instead of waiting for it until the timeout.
      std::exception_ptr failure;
      try {
        program = lowerNew();
      } catch (const std::exception&) {
        failure = std::current_exception();
      }
      checkNewProgramAgrees(program ? program->resharded.fusion.get() : nullptr, failure, sig, params, device, timeout);
    } else {
      program = lowerNew();
    }
    // The ranks agree on the program, hence on its backend: one that needs a world-collective
    // first step (UCC's context) takes it here, where every rank is.
    if (multi && comm->size() > 1)
      withTimeoutPolicy("preparing the communication backend over the world",
                        [&] { comm->prepare(comm->resolve(params.lower.communicator_backend, device), timeout); });
    it = programs_.emplace(key, std::move(program)).first;
  }
  last_ = it->second;
  const Program& program = *it->second;
  const Fusion& lowered = *program.resharded.fusion;

  ValueMap values;
  for (size_t i = 0; i < lowered.inputs().size(); ++i) {
    const Val* v = lowered.inputs()[i];
    if (!v->isTensor())
      values.scalars[v] = representedAs(v->dtype(), std::get<double>(inputs[i]));  // a Half input of 0.1 is Half's
    else if (sig.present[i] && std::holds_alternative<Tensor>(inputs[i]))
      values.tensors[v] = std::get<Tensor>(inputs[i]);
  }
  bindFreshRandomState(lowered, values, seed_setting.seed, sig.given_rng_offset);
  HostIrEvaluatorParams eval_params = params.executor;
  eval_params.timeout = timeout;
  program.hic->number_of_streams = eval_params.number_of_streams;
  if (!trace_path.empty() && multi && comm->size() > 1) comm->barrier();  // one time origin for all ranks
  if (const char* env = std::getenv("MESHFUSE_TRACE_HOST"); env && std::string(env) == "1")
    eval_params.trace_host = true;
  std::unique_ptr<Tracer> tracer = trace_path.empty() ? nullptr : std::make_unique<Tracer>();
  const double program_begin = tracer ? tracer->nowUs() : 0.0;
  withTimeoutPolicy("while running the host program",
                    [&] { HostIrEvaluator(*program.hic, eval_params, *program.executor, tracer.get()).run(values); });
  if (tracer && eval_params.trace_host) tracer->add("host program", "host", 0, program_begin, tracer->nowUs());
  if (tracer) writeTraceFromAllRanks(*tracer, trace_path, multi ? comm : nullptr, timeout);

  std::vector<Tensor> outputs;
  for (const Val* out : lowered.outputs()) {
    auto found = values.tensors.find(out);
    outputs.push_back(found == values.tensors.end() ? Tensor() : found->second);
    copyIfAliased(out, inputs, outputs);
  }
  return outputs;
}

void FusionExecutorCache::checkLeavesOnce() {
  // A walk over every operand, and a property of the definition: once per fusion version.
  if (leaves_checked_version_ == fusion_->version()) return;
  checkEveryLeafIsBound(*fusion_);
  leaves_checked_version_ = fusion_->version();
}

uint64_t FusionExecutorCache::definitionHash(const MultiDeviceExecutorParams& params) {
  const DefinitionKey key{fusion_->version(), params.lower.communicator_backend, params.executor.number_of_streams};
  if (key != definition_key_) {
    definition_lines_ = definitionLines(*fusion_, params);
    uint64_t hash = fingerprintHash("");
    for (const std::string& line : definition_lines_) hash = fingerprintHash(line + "\n", hash);
    definition_hash_ = hash;
    definition_key_ = key;
  }
  return definition_hash_;
}

void FusionExecutorCache::reportInputError(const std::string& error, const MultiDeviceExecutorParams& params) {
  if (isMultiDevice(*fusion_) && Communicator::instance().size() > 1) {
    const std::lock_guard<std::mutex> world_turn(worldExecuteMutex());
    const auto timeout = effectiveTimeout(params.executor).timeout;
    withTimeoutPolicy("in execute's input agreement over the world (backend mpi)",
                      [&] { return agreeOnInputs(*fusion_, nullptr, error, timeout); });
  }
  throw UserError(error);
}

std::string FusionExecutorCache::lastHostIr() const { return last_ ? last_->hic->toString() : ""; }

std::string FusionExecutorCache::lastLoweredFusion() const { return last_ ? last_->resharded.fusion->toString() : ""; }

std::shared_ptr<Fusion> FusionExecutorCache::lastOutputShardings() const {
  if (!last_) return nullptr;
  auto placed = std::make_shared<Fusion>();
  const Fusion& lowered = *last_->resharded.fusion;
  for (size_t i = 0; i < lowered.outputs().size(); ++i) {
    const auto* tv = static_cast<const TensorView*>(lowered.outputs()[i]);  // outputs are tensors (addOutput)
    const std::vector<int64_t>& bound = last_->output_shapes[i];
    TensorView* copy = placed->newTensor(tv->dtype(), bound.empty() ? tv->shape() : bound, tv->contiguity());
    if (tv->hasDeviceMesh()) copy->setDeviceMesh(*tv->deviceMesh());
    copy->setLoop(tv->loop());
    placed->addOutput(copy);
  }
  return placed;
}

}  // namespace meshfuse

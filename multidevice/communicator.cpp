// The Communicator: MPI bootstrap (mpirun, srun/PMIx or an Open MPI singleton), the backend
// registry, the per-(type, team) backend cache and the MPI communicators of teams.
#include "multidevice/communicator.h"

#include <mpi.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <set>
#include <stdexcept>

#include "backends/mpi/mpi_helpers.h"
#include "ir/user_error.h"
#include "multidevice/backend_plugins.h"
#include "multidevice/timeout_env.h"
#include "runtime/device_count.h"

namespace meshfuse {

namespace {

// Function-local statics: registration runs during static initialization of other translation
// units, in an order we do not control, so the registry must be built on first use.
struct Registered {
  BackendFactory factory;
  BackendWorldSetup world_setup;  // may be empty
};
std::map<CommunicatorBackend, Registered>& registry() {
  static std::map<CommunicatorBackend, Registered> backends;
  return backends;
}
std::mutex& registryMutex() {
  static std::mutex m;
  return m;
}

// Guards Communicator::mpi_comms_. Separate from Communicator::mutex_ (which guards the backend
// cache) because a backend factory, run under mutex_, asks for its team's MPI communicator.
std::mutex& commsMutex() {
  static std::mutex m;
  return m;
}

// A deterministic hash of the team (same on every rank, unlike std::hash across builds), used as
// the tag that keeps concurrent MPI_Comm_create_group calls of different teams apart.
int tagForTeam(const std::vector<int64_t>& team) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (int64_t r : team) {
    h ^= static_cast<uint64_t>(r);
    h *= 1099511628211ull;
  }
  return static_cast<int>(h % 32767u);  // MPI guarantees tags up to 32767
}

// The deadline of Communicator::barrier: MESHFUSE_TIMEOUT seconds, 300 s by default.
std::chrono::milliseconds barrierTimeout() { return timeoutFromEnvironmentOr(std::chrono::seconds(300)); }

std::string availableList(const std::vector<CommunicatorBackend>& types) {
  std::string out;
  for (CommunicatorBackend t : types) out += (out.empty() ? "" : ", ") + toString(t);
  return out;
}

}  // namespace

bool registerBackend(CommunicatorBackend type, BackendFactory factory, BackendWorldSetup world_setup) {
  std::lock_guard<std::mutex> lock(registryMutex());
  registry()[type] = {std::move(factory), std::move(world_setup)};
  return true;
}

namespace {
std::atomic<bool> communicator_created{false};
Communicator* the_communicator = nullptr;  // for the exit handler, which must not run instance()'s check
// Set in a fork's child (pthread_atfork, registered when the world is joined): instance() reads it on
// every call, where a getpid() would be a system call each time.
std::atomic<bool> in_forked_child{false};
}  // namespace

namespace {
// MESHFUSE_ABORT_ON_EXCEPTION (README): 0, false, no or off let a failing rank exit alone.
bool abortsOnFailure() {
  const char* v = std::getenv("MESHFUSE_ABORT_ON_EXCEPTION");
  if (v == nullptr) return true;
  std::string s(v);
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return s != "0" && s != "false" && s != "no" && s != "off";
}
}  // namespace

Communicator& Communicator::instance() {
  // Never destroyed: other statics may still use it during exit; the cleanup that matters
  // (backends, communicators, MPI_Finalize) runs from an atexit handler installed at init.
  static Communicator* communicator = new Communicator();
  communicator_created.store(true, std::memory_order_release);
  // A forked child that executed took part in its parent's collectives as the parent's rank: the
  // parent's next execute then completed against the wrong partner and returned garbage, silently.
  if (communicator->inForkedChild()) throw UserError(communicator->forkedChildError());
  return *communicator;
}

bool Communicator::inForkedChild() const { return in_forked_child.load(std::memory_order_relaxed); }

std::string Communicator::forkedChildError() const {
  return "meshfuse: this process (pid " + std::to_string(getpid()) + ") is a fork of rank " + std::to_string(rank_) +
         " (pid " + std::to_string(owner_pid_) +
         "), which is no rank: MPI and the backends' connections do not survive fork. Run meshfuse in the "
         "processes the launcher started; forked workers (a DataLoader's) may load data, not execute";
}

bool Communicator::exists() { return communicator_created.load(std::memory_order_acquire); }

namespace {
// A process that a rank starts itself (multiprocessing's spawn or forkserver workers, a subprocess)
// inherits the rank's launcher environment: MPI_Init there took the launcher's identity of that rank
// and crashed ("orte_init failed") or hung the worker pool. The rank records who it is; a process
// with the same launcher identity but another pid is refused before MPI_Init. A job that a rank
// launches (a nested mpirun) has a namespace of its own, and passes.
constexpr const char* kLaunchedRankVariable = "MESHFUSE_LAUNCHED_RANK";

std::string launcherIdentity() {
  const char* ns = std::getenv("PMIX_NAMESPACE");
  const char* rank = std::getenv("PMIX_RANK");
  if (ns == nullptr || rank == nullptr) return "";
  return std::string(ns) + ":" + rank;
}

void refuseChildOfARank() {
  const char* recorded = std::getenv(kLaunchedRankVariable);
  const std::string mine = launcherIdentity();
  if (recorded == nullptr || mine.empty()) return;
  const std::string value(recorded);
  const size_t at = value.rfind(':');
  if (at == std::string::npos || value.substr(0, at) != mine) return;
  const std::string pid = value.substr(at + 1);
  if (pid == std::to_string(getpid())) return;
  const std::string rank = mine.substr(mine.rfind(':') + 1);
  throw UserError("meshfuse: this process (pid " + std::to_string(getpid()) + ") was started by rank " + rank +
                  " (pid " + pid +
                  ") of the job, not by the launcher, and is no rank: MPI cannot start in it. Run meshfuse in "
                  "the processes the launcher started; workers (a DataLoader's, a process pool) may load data, "
                  "not execute");
}
}  // namespace

Communicator::Communicator() {
  refuseChildOfARank();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Open MPI's non-blocking allreduce takes a binomial tree whenever the call is in place or
    // the team has fewer than 4 ranks, at any size: 1.4-1.6x slower than the blocking
    // MPI_Allreduce from 1 MiB up (bench_collectives, 2 ranks). Its Rabenseifner schedule
    // (reduce-scatter + allgather) matches the blocking call. A default only: a value the user or
    // the launcher exported wins, and MPI started by someone else (mpi4py) keeps its own.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", /*overwrite=*/0);
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw std::runtime_error("meshfuse: MPI_Init_thread failed");
    if (provided < MPI_THREAD_MULTIPLE)
      std::fprintf(stderr, "meshfuse: warning: MPI provides thread level %d, not MPI_THREAD_MULTIPLE\n", provided);
    finalize_mpi_ = true;  // we started MPI, so we end it; mpi4py ends the MPI it started
  }
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  rank_ = world_rank;
  size_ = world_size;
  owner_pid_ = static_cast<int64_t>(getpid());
  the_communicator = this;
  pthread_atfork(nullptr, nullptr, [] { in_forked_child.store(true, std::memory_order_relaxed); });
  if (const std::string identity = launcherIdentity(); !identity.empty())
    setenv(kLaunchedRankVariable, (identity + ":" + std::to_string(owner_pid_)).c_str(), /*overwrite=*/1);

  nodes_ = NodeTopology::discover();

  // Handlers run in reverse order of registration, so this one runs before those registered
  // earlier (e.g. by libraries loaded before us) and after those registered later. A lambda in a
  // member function may touch private members. glibc's on_exit also gives the exit status.
  static const auto at_exit = [](int status) {
    Communicator& c = *the_communicator;
    // A forked child's exit is its own: finalizing or aborting would act on the parent's world (it
    // hung in MPI_Finalize, with the parent waiting for it).
    if (c.inForkedChild()) return;
    if (c.broken_) return;  // see markBroken: freeing or finalizing would wait for the missing rank
    // A rank that exits with a failure status (sys.exit(3), a C++ main returning 1) while the others
    // may be waiting in a collective for it: MPI_Finalize would wait for them, and they for it,
    // until MESHFUSE_TIMEOUT. End the job now, as an uncaught Python exception does.
    if (status != 0 && c.size_ > 1 && !mpi::isFinalized() && abortsOnFailure())
      c.abort(status, "this rank exits with status " + std::to_string(status) +
                          "; MESHFUSE_ABORT_ON_EXCEPTION=0 exits this rank alone instead");
    {
      std::lock_guard<std::mutex> lock(c.mutex_);
      c.backends_.clear();  // backends may free MPI objects: before MPI_Finalize
    }
    const bool finalized = mpi::isFinalized();
    {
      std::lock_guard<std::mutex> lock(commsMutex());
      for (auto& [team, handle] : c.mpi_comms_) {
        MPI_Comm comm = mpi::fromHandle(handle);
        if (!finalized) MPI_Comm_free(&comm);
      }
      c.mpi_comms_.clear();
    }
    if (c.finalize_mpi_ && !finalized) MPI_Finalize();
    c.finalize_mpi_ = false;
  };
#ifdef __GLIBC__
  on_exit([](int status, void* /*unused*/) { at_exit(status); }, nullptr);
#else
  std::atexit([] { at_exit(0); });  // no exit status to read: finalize as on success
#endif
}

// Not reached (the instance lives until exit, see instance()); defined because it is declared.
Communicator::~Communicator() = default;

void Communicator::barrier() {
  const std::vector<int64_t> world = [&] {
    std::vector<int64_t> all(static_cast<size_t>(size_));
    std::iota(all.begin(), all.end(), 0);
    return all;
  }();
  MPI_Comm comm = mpi::fromHandle(mpiCommFor(world));
  std::vector<MPI_Request> request(1, MPI_REQUEST_NULL);
  mpi::check(MPI_Ibarrier(comm, request.data()), "MPI_Ibarrier");
  const auto start = std::chrono::steady_clock::now();
  if (!mpi::pollUntil(request, start + barrierTimeout()))
    throw CommunicationTimeout("Communicator::barrier: rank " + std::to_string(rank_) + " waited " +
                               mpi::secondsToString(std::chrono::steady_clock::now() - start) +
                               " for the other ranks of the world (size " + std::to_string(size_) + ")");
}

std::vector<CommunicatorBackend> Communicator::availableBackends() const {
  loadBackendPlugins();  // before the lock: a plugin registers its backend as it loads
  std::lock_guard<std::mutex> lock(registryMutex());
  std::vector<CommunicatorBackend> types;
  for (const auto& [type, factory] : registry()) types.push_back(type);  // map order = enum order
  return types;
}

bool Communicator::isAvailable(CommunicatorBackend type) const {
  if (type == CommunicatorBackend::Auto) return true;  // always resolves to something (MPI at least)
  loadBackendPlugin(type);
  std::lock_guard<std::mutex> lock(registryMutex());
  return registry().count(type) != 0;
}

std::string Communicator::whyUnavailable(CommunicatorBackend type) const {
  if (isAvailable(type)) return "";
  const std::string plugin_error = loadBackendPlugin(type);  // loaded (or failed) once: the same message
  return "not available in this build" + (plugin_error.empty() ? "" : " (" + plugin_error + ")");
}

CommunicatorBackend chooseAutoBackend(DeviceType device_type, bool nccl_available, bool members_share_a_gpu) {
  if (device_type == DeviceType::CUDA && nccl_available && !members_share_a_gpu) return CommunicatorBackend::Nccl;
  return CommunicatorBackend::Mpi;
}

CommunicatorBackend Communicator::resolve(CommunicatorBackend requested, Device device,
                                          const std::vector<int64_t>& team) const {
  if (requested != CommunicatorBackend::Auto) return requested;
  const bool cuda = device.type == DeviceType::CUDA;
  const int64_t gpus = cuda ? cudaDeviceCountOrZero() : 0;
  return chooseAutoBackend(device.type, isAvailable(CommunicatorBackend::Nccl), nodes_.membersShareAGpu(team, gpus));
}

CommunicatorBackend Communicator::resolve(CommunicatorBackend requested, Device device) const {
  std::vector<int64_t> world(static_cast<size_t>(size_));
  std::iota(world.begin(), world.end(), 0);
  return resolve(requested, device, world);
}

Backend& Communicator::backend(CommunicatorBackend type, const std::vector<int64_t>& team) {
  if (type == CommunicatorBackend::Auto)
    throw std::invalid_argument(
        "Communicator::backend: resolve 'auto' for the tensors' device first (Communicator::resolve)");
  if (team.empty()) throw std::invalid_argument("Communicator::backend: the team is empty");
  std::set<int64_t> seen;
  for (int64_t r : team) {
    if (r < 0 || r >= size_)
      throw std::invalid_argument("Communicator::backend: team " + teamToString(team) + " names rank " +
                                  std::to_string(r) + ", but the world has " + std::to_string(size_) + " ranks");
    if (!seen.insert(r).second)
      throw std::invalid_argument("Communicator::backend: team " + teamToString(team) + " names rank " +
                                  std::to_string(r) + " twice");
  }
  if (!seen.count(rank_))
    throw std::invalid_argument("Communicator::backend: rank " + std::to_string(rank_) + " is not in team " +
                                teamToString(team) + "; only members may ask for the team's backend");

  loadBackendPlugin(type);
  BackendFactory factory;
  {
    std::lock_guard<std::mutex> lock(registryMutex());
    auto it = registry().find(type);
    if (it != registry().end()) factory = it->second.factory;
  }
  if (!factory)
    throw std::invalid_argument("communicator backend '" + toString(type) + "' is " + whyUnavailable(type) +
                                "; available: " + availableList(availableBackends()));

  std::lock_guard<std::mutex> lock(mutex_);
  auto key = std::make_pair(type, team);
  auto it = backends_.find(key);
  if (it == backends_.end()) it = backends_.emplace(key, factory(*this, team)).first;
  return *it->second;
}

void Communicator::prepare(CommunicatorBackend type, std::chrono::milliseconds timeout) {
  loadBackendPlugin(type);
  BackendWorldSetup setup;
  {
    std::lock_guard<std::mutex> lock(registryMutex());
    auto it = registry().find(type);
    if (it != registry().end()) setup = it->second.world_setup;
  }
  if (!setup) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!prepared_.insert(type).second) return;
  setup(*this, timeout);
}

void* Communicator::mpiCommFor(const std::vector<int64_t>& team) {
  std::lock_guard<std::mutex> lock(commsMutex());
  auto it = mpi_comms_.find(team);
  if (it != mpi_comms_.end()) return it->second;
  if (std::find(team.begin(), team.end(), rank_) == team.end())
    throw std::invalid_argument("Communicator::mpiCommFor: rank " + std::to_string(rank_) + " is not in team " +
                                teamToString(team));

  std::vector<int64_t> world(static_cast<size_t>(size_));
  std::iota(world.begin(), world.end(), 0);
  MPI_Comm comm = MPI_COMM_NULL;
  if (team == world) {
    // Non-blocking, with a deadline: the first exchange over the world (execute's input
    // agreement) must fail in bounded time when a rank never arrives, not hang in MPI_Comm_dup.
    std::vector<MPI_Request> request(1, MPI_REQUEST_NULL);
    mpi::check(MPI_Comm_idup(MPI_COMM_WORLD, &comm, request.data()), "MPI_Comm_idup");
    const auto start = std::chrono::steady_clock::now();
    if (!mpi::pollUntil(request, start + barrierTimeout()))
      throw CommunicationTimeout("Communicator: creating the world's MPI communicator: rank " + std::to_string(rank_) +
                                 " waited " + mpi::secondsToString(std::chrono::steady_clock::now() - start) +
                                 " for the other ranks of the world (size " + std::to_string(size_) +
                                 "); one of them did not arrive");
  } else {
    // A group in the team's order makes communicator rank i = team member i; creation is
    // collective only over the members, so other ranks need not take part.
    std::vector<int> ranks(team.begin(), team.end());
    MPI_Group world_group, team_group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, static_cast<int>(ranks.size()), ranks.data(), &team_group);
    int rc = MPI_Comm_create_group(MPI_COMM_WORLD, team_group, tagForTeam(team), &comm);
    MPI_Group_free(&team_group);
    MPI_Group_free(&world_group);
    mpi::check(rc, "MPI_Comm_create_group");
  }
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);  // errors become exceptions, not aborts
  void* handle = mpi::toHandle(comm);
  mpi_comms_.emplace(team, handle);
  return handle;
}

std::vector<std::string> Communicator::allgatherBytes(const std::vector<int64_t>& team, const std::string& bytes,
                                                      std::chrono::milliseconds timeout) {
  MPI_Comm comm = mpi::fromHandle(mpiCommFor(team));
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  auto timedOut = [&](const char* phase) {
    return CommunicationTimeout("Communicator::allgatherBytes (" + std::string(phase) + "): rank " +
                                std::to_string(rank_) + " waited " +
                                mpi::secondsToString(std::chrono::steady_clock::now() - start) + " for ranks of team " +
                                teamToString(team) + "; one of them did not arrive");
  };
  if (bytes.size() > static_cast<size_t>(INT32_MAX))
    throw std::invalid_argument("Communicator::allgatherBytes: " + std::to_string(bytes.size()) +
                                " bytes is more than one MPI call carries");

  // Sizes first (so unequal contributions are handled, not truncated), then the bytes. On a
  // timeout the buffers must outlive the still-pending request: they are leaked on purpose.
  struct Exchange {
    std::vector<int> sizes, offsets;
    std::string sent, gathered;
  };
  auto* ex = new Exchange{std::vector<int>(team.size()), std::vector<int>(team.size()), bytes, {}};
  int my_size = static_cast<int>(bytes.size());
  std::vector<MPI_Request> request(1, MPI_REQUEST_NULL);
  mpi::check(MPI_Iallgather(&my_size, 1, MPI_INT, ex->sizes.data(), 1, MPI_INT, comm, request.data()),
             "MPI_Iallgather");
  if (!mpi::pollUntil(request, deadline)) throw timedOut("sizes");
  int64_t total = 0;
  for (size_t i = 0; i < team.size(); ++i) {
    ex->offsets[i] = static_cast<int>(total);
    total += ex->sizes[i];
  }
  if (total > INT32_MAX)
    throw std::invalid_argument("Communicator::allgatherBytes: " + std::to_string(total) +
                                " bytes in all is more than one MPI call carries");
  ex->gathered.resize(static_cast<size_t>(total));
  mpi::check(MPI_Iallgatherv(ex->sent.data(), my_size, MPI_BYTE, ex->gathered.data(), ex->sizes.data(),
                             ex->offsets.data(), MPI_BYTE, comm, request.data()),
             "MPI_Iallgatherv");
  if (!mpi::pollUntil(request, deadline)) throw timedOut("bytes");

  std::vector<std::string> out;
  out.reserve(team.size());
  for (size_t i = 0; i < team.size(); ++i)
    out.push_back(ex->gathered.substr(static_cast<size_t>(ex->offsets[i]), static_cast<size_t>(ex->sizes[i])));
  delete ex;
  return out;
}

void Communicator::abort(int code, const std::string& why) {
  if (inForkedChild()) {  // no rank: it ends alone, as it would without meshfuse
    std::fprintf(stderr, "meshfuse: a forked child of rank %lld exits (code %d): %s\n", static_cast<long long>(rank_),
                 code, why.c_str());
    std::fflush(stderr);
    std::_Exit(code);
  }
  std::fprintf(stderr, "meshfuse: rank %lld of %lld aborts the job (code %d): %s\n", static_cast<long long>(rank_),
               static_cast<long long>(size_), code, why.c_str());
  std::fflush(stderr);
  if (!mpi::isFinalized()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace meshfuse

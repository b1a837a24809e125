#include "backends/ucc/ucc_context.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>

#include "backends/backend.h"
#include "backends/ucc/ucc_oob.h"
#include "multidevice/communicator.h"

namespace meshfuse::ucc {

void check(ucc_status_t status, const char* what) {
  if (status != UCC_OK) throw std::runtime_error(std::string(what) + " failed: " + ucc_status_string(status));
}

namespace {

bool progressThreadWanted() {
  const char* env = std::getenv("MESHFUSE_UCC_PROGRESS_THREAD");
  return env && std::strcmp(env, "1") == 0;
}

std::mutex& creationMutex() {
  static std::mutex m;
  return m;
}
// Leaked on purpose (see the header): a static destructor would run after MPI_Finalize and after
// teams that still refer to the context.
Context*& theContext() {
  static Context* context = nullptr;
  return context;
}

std::vector<int64_t> worldOf(const Communicator& communicator) {
  std::vector<int64_t> world(static_cast<size_t>(communicator.size()));
  std::iota(world.begin(), world.end(), 0);
  return world;
}

}  // namespace

void Context::createForWorld(Communicator& communicator, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(creationMutex());
  if (!theContext()) theContext() = new Context(&communicator, timeout);
}

Context& Context::forTeam(Communicator& communicator, const std::vector<int64_t>& team,
                          std::chrono::milliseconds timeout) {
  if (team == worldOf(communicator)) createForWorld(communicator, timeout);  // collective: every rank is here
  std::lock_guard<std::mutex> lock(creationMutex());
  if (!theContext()) {
    std::fprintf(stderr,
                 "meshfuse: warning: rank %lld: the first UCC team %s is not the world and the UCC backend was not "
                 "prepared over the world (Communicator::prepare): its context has no world address exchange, so "
                 "UCC's teams run over TCP instead of shared memory\n",
                 static_cast<long long>(communicator.rank()), teamToString(team).c_str());
    theContext() = new Context(nullptr, timeout);
  }
  return *theContext();
}

Context& Context::instance() {
  Context* context = theContext();
  if (!context) throw std::logic_error("ucc: no context yet (a UCC team creates it)");
  return *context;
}

Context::Context(Communicator* world, std::chrono::milliseconds timeout) {
  const bool thread = progressThreadWanted();
  ucc_lib_config_h lib_config = nullptr;
  check(ucc_lib_config_read(nullptr, nullptr, &lib_config), "ucc_lib_config_read");
  ucc_lib_params_t lib_params;
  std::memset(&lib_params, 0, sizeof lib_params);
  lib_params.mask = UCC_LIB_PARAM_FIELD_THREAD_MODE;
  lib_params.thread_mode = thread ? UCC_THREAD_MULTIPLE : UCC_THREAD_SINGLE;
  const ucc_status_t init = ucc_init(&lib_params, lib_config, &lib_);
  ucc_lib_config_release(lib_config);
  check(init, "ucc_init");

  ucc_context_config_h context_config = nullptr;
  check(ucc_context_config_read(lib_, nullptr, &context_config), "ucc_context_config_read");
  ucc_context_params_t context_params;
  std::memset(&context_params, 0, sizeof context_params);
  // Used only while the context is created (its address exchange), so a local suffices.
  Oob oob{world, world ? worldOf(*world) : std::vector<int64_t>{}, std::chrono::steady_clock::now() + timeout, {}};
  if (world) {
    context_params.mask = UCC_CONTEXT_PARAM_FIELD_OOB;
    context_params.oob = oob.coll(world->rank());
  }
  const ucc_status_t created = ucc_context_create(lib_, &context_params, context_config, &context_);
  ucc_context_config_release(context_config);
  oob.rethrow();  // a rank that did not come: CommunicationTimeout
  check(created, "ucc_context_create");
  if (thread) thread_ = std::thread([this] { runProgressThread(); });
}

void Context::started() {
  if (!hasProgressThread()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++in_flight_;
  }
  busy_.notify_one();
}

void Context::finished() {
  if (!hasProgressThread()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  --in_flight_;
}

void Context::runProgressThread() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      busy_.wait(lock, [&] { return in_flight_ > 0; });
    }
    progress();
  }
}

}  // namespace meshfuse::ucc

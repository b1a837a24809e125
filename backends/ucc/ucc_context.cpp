#include "backends/ucc/ucc_context.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace meshfuse::ucc {

void check(ucc_status_t status, const char* what) {
  if (status != UCC_OK) throw std::runtime_error(std::string(what) + " failed: " + ucc_status_string(status));
}

namespace {
bool progressThreadWanted() {
  const char* env = std::getenv("MESHFUSE_UCC_PROGRESS_THREAD");
  return env && std::strcmp(env, "1") == 0;
}
}  // namespace

Context& Context::instance() {
  // Leaked on purpose (see the header): a static destructor would run after MPI_Finalize and
  // after teams that still refer to the context.
  static Context* context = new Context();
  return *context;
}

Context::Context() {
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
  std::memset(&context_params, 0, sizeof context_params);  // no OOB: see the header
  const ucc_status_t created = ucc_context_create(lib_, &context_params, context_config, &context_);
  ucc_context_config_release(context_config);
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

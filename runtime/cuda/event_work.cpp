#include "runtime/cuda/event_work.h"

#include <cstdlib>
#include <thread>

#include "multidevice/timeout_env.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/streams.h"

namespace meshfuse::cuda {

EventWork::EventWork(int device, cudaStream_t stream, std::string what, Hooks hooks)
    : device_(device), what_(std::move(what)), hooks_(std::move(hooks)) {
  DeviceGuard guard(device);
  MESHFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  MESHFUSE_CUDA_CHECK(cudaEventRecord(event_, stream));
}

EventWork::~EventWork() {
  if (event_) cudaEventDestroy(event_);
}

bool EventWork::test() {
  if (done_) return true;
  DeviceGuard guard(device_);
  cudaError_t st = cudaEventQuery(event_);
  if (st == cudaSuccess) return done_ = true;
  if (st != cudaErrorNotReady) MESHFUSE_CUDA_CHECK(st);
  if (hooks_.async_error) {
    std::string err = hooks_.async_error();
    if (!err.empty()) throw std::runtime_error(what_ + " failed: " + err);
  }
  return false;
}

void EventWork::wait(std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  for (int polls = 0; !test(); ++polls) {
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      if (hooks_.on_timeout) hooks_.on_timeout();
      double waited = std::chrono::duration<double>(now - start).count();
      throw CommunicationTimeout(what_ + ": not complete after waiting " + std::to_string(waited) + " s (timeout " +
                                 std::to_string(timeout.count()) + " ms)" +
                                 (hooks_.on_timeout ? "; the communicator was aborted" : ""));
    }
    // Spin briefly (short operations finish within microseconds), then back off.
    if (polls < 1000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void checkDeviceTensor(const std::string& op, const char* name, const Tensor& t, int device, const char* backend) {
  if (!t.defined()) throw std::invalid_argument(op + ": " + name + " is undefined");
  if (t.device().type != DeviceType::CUDA)
    throw std::invalid_argument(op + ": " + name + " " + t.toString() + " is a host tensor; the " + backend +
                                " backend carries CUDA tensors only (use mpi or gloo)");
  if (t.device().index != device)
    throw std::invalid_argument(op + ": " + name + " " + t.toString() + " is not on this rank's " + backend +
                                " device cuda:" + std::to_string(device));
  if (!t.isContiguous()) throw std::invalid_argument(op + ": " + name + " " + t.toString() + " is not contiguous");
}

std::chrono::milliseconds bootstrapTimeout() { return timeoutFromEnvironmentOr(std::chrono::seconds(300)); }

}  // namespace meshfuse::cuda

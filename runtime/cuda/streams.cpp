// Stream pools, current streams and device guards (see streams.h).
#include "runtime/cuda/streams.h"

#include <array>
#include <mutex>
#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "runtime/device_count.h"

namespace meshfuse::cuda {

namespace {
constexpr int kPoolSize = 8;
constexpr int kMaxDevices = 64;

struct DevicePool {
  std::once_flag created;
  std::array<cudaStream_t, kPoolSize> streams{};
};
std::array<DevicePool, kMaxDevices> g_pools;

thread_local std::array<cudaStream_t, kMaxDevices> t_current{};

void checkIndex(int device) {
  if (device < 0 || device >= kMaxDevices)
    throw std::invalid_argument("CUDA device index " + std::to_string(device) + " is out of range");
}
}  // namespace

int deviceCount(std::string* reason) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls report their own
    if (reason) *reason = cudaGetErrorString(err);
    return 0;
  }
  if (count == 0 && reason) *reason = "cudaGetDeviceCount found no device";
  return count;
}

const bool counter_registered = registerCudaDeviceCounter([] { return deviceCount(nullptr); });

int streamPoolSize() { return kPoolSize; }

Stream poolStream(int device, int index) {
  checkIndex(device);
  DevicePool& pool = g_pools[device];
  std::call_once(pool.created, [&] {
    DeviceGuard guard(device);
    for (auto& s : pool.streams) MESHFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  });
  return pool.streams[((index % kPoolSize) + kPoolSize) % kPoolSize];
}

Stream currentStream(int device) {
  checkIndex(device);
  return t_current[device];
}

void setCurrentStream(int device, Stream stream) {
  checkIndex(device);
  t_current[device] = stream;
}

CurrentStreamGuard::CurrentStreamGuard(int device, Stream stream) : device_(device), previous_(currentStream(device)) {
  setCurrentStream(device, stream);
}
CurrentStreamGuard::~CurrentStreamGuard() { setCurrentStream(device_, previous_); }

DeviceGuard::DeviceGuard(int device) : previous_(-1) {
  MESHFUSE_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) MESHFUSE_CUDA_CHECK(cudaSetDevice(device));
}
DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_ && previous_ >= 0) cudaSetDevice(previous_);
}

namespace {
thread_local int t_matmul_sm_target = 0;
}
int matmulSmCountTarget() { return t_matmul_sm_target; }
void setMatmulSmCountTarget(int sms) { t_matmul_sm_target = sms < 0 ? 0 : sms; }

void streamWaitStream(int device, Stream waiter, Stream producer) {
  if (waiter == producer) return;
  DeviceGuard guard(device);
  cudaEvent_t event;
  MESHFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  MESHFUSE_CUDA_CHECK(cudaEventRecord(event, producer));
  MESHFUSE_CUDA_CHECK(cudaStreamWaitEvent(waiter, event, 0));
  MESHFUSE_CUDA_CHECK(cudaEventDestroy(event));  // released once the wait has been satisfied
}

void synchronizeStream(int device, Stream stream) {
  DeviceGuard guard(device);
  MESHFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void synchronizeDevice(int device) {
  DeviceGuard guard(device);
  MESHFUSE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace meshfuse::cuda

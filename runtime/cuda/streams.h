// CUDA devices and streams for the rest of meshfuse, without CUDA headers (so host_ir/ and tests
// include it in any build): a pool of non-blocking streams per device, and the calling thread's
// current stream per device, on which executors and the NCCL/CUDA IPC backends enqueue their work.
// The host IR evaluator pipelines a stream-parallel axis by making pool streams current in turn.
#pragma once
#include <string>

struct CUstream_st;  // cudaStream_t is `CUstream_st*` in the CUDA headers

namespace meshfuse::cuda {

using Stream = CUstream_st*;  // nullptr is the legacy default stream

// Number of usable CUDA devices; 0 with `reason` set (from cudaGetDeviceCount) when there is none.
int deviceCount(std::string* reason = nullptr);

// Streams of the pool per device (created on first use, cudaStreamNonBlocking).
int streamPoolSize();
Stream poolStream(int device, int index);  // index is taken modulo streamPoolSize()

// The calling thread's current stream for `device`: the legacy default stream until set (so work
// orders with frameworks such as torch that use it by default).
Stream currentStream(int device);
void setCurrentStream(int device, Stream stream);

// Makes `stream` current for `device` for the guard's lifetime.
class CurrentStreamGuard {
 public:
  CurrentStreamGuard(int device, Stream stream);
  ~CurrentStreamGuard();
  CurrentStreamGuard(const CurrentStreamGuard&) = delete;
  CurrentStreamGuard& operator=(const CurrentStreamGuard&) = delete;

 private:
  int device_;
  Stream previous_;
};

// Makes `device` the calling thread's CUDA device for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
};

// The calling thread's cuBLASLt SM count target for the matmuls it queues (0: every
// multiprocessor); stream loops lower it while communication runs beside their matmuls.
int matmulSmCountTarget();
void setMatmulSmCountTarget(int sms);

// `waiter` waits (on the GPU, the host does not block) for the work queued so far on `producer`.
void streamWaitStream(int device, Stream waiter, Stream producer);
void synchronizeStream(int device, Stream stream);
void synchronizeDevice(int device);

}  // namespace meshfuse::cuda

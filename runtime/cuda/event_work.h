// A Work that completes when a CUDA event does: the NCCL and CUDA IPC backends record one on the
// current stream after enqueuing an operation. wait() polls the event (and an optional error
// source, such as ncclCommGetAsyncError) until a deadline; on expiry it runs the optional
// on_timeout (ncclCommAbort) and throws CommunicationTimeout naming the operation.
// Internal header (CUDA types).
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <string>

#include "backends/backend.h"

namespace meshfuse::cuda {

class EventWork final : public Work {
 public:
  struct Hooks {
    std::function<std::string()> async_error;  // non-empty text: the operation failed
    std::function<void()> on_timeout;
  };
  // Records a new event on `stream` of `device`; `what` names the operation, team and backend.
  EventWork(int device, cudaStream_t stream, std::string what, Hooks hooks = {});
  ~EventWork() override;
  void wait(std::chrono::milliseconds timeout) override;
  bool test() override;

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
  std::string what_;
  Hooks hooks_;
  bool done_ = false;
};

// The argument check of the device backends (nccl, cuda): `t` is defined, a CUDA tensor on
// `device` and contiguous; else std::invalid_argument naming the operation, the tensor and why.
void checkDeviceTensor(const std::string& op, const char* name, const Tensor& t, int device, const char* backend);

// The deadline for bootstrap exchanges: MESHFUSE_TIMEOUT seconds, 300 s by default.
std::chrono::milliseconds bootstrapTimeout();

}  // namespace meshfuse::cuda

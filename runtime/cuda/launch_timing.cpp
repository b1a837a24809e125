#include "runtime/cuda/launch_timing.h"

#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"

namespace meshfuse::cuda {

namespace {
// A start and a stop event, destroyed however the timing ends (a launch may throw).
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    MESHFUSE_CUDA_CHECK(cudaEventCreate(&start));
    MESHFUSE_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};
}  // namespace

bool streamCapturing(Stream stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone;
}

std::optional<float> timeLaunches(Stream stream, int repeats, const std::function<bool()>& launch) {
  if (!launch()) return std::nullopt;  // the warm-up
  const EventPair events;
  MESHFUSE_CUDA_CHECK(cudaEventRecord(events.start, stream));
  bool ok = true;
  for (int r = 0; r < repeats && ok; ++r) ok = launch();
  MESHFUSE_CUDA_CHECK(cudaEventRecord(events.stop, stream));
  MESHFUSE_CUDA_CHECK(cudaEventSynchronize(events.stop));
  if (!ok) return std::nullopt;
  float ms = 0;
  MESHFUSE_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
  return ms / static_cast<float>(repeats);
}

}  // namespace meshfuse::cuda

// The CUDA StreamSet (runtime/stream_set.h): chunk i runs on pool stream i % depth. Pool streams
// are non-blocking, so they order with the caller's stream only through the events recorded here:
// each waits for the caller's queued work at creation, and the caller waits for each at join().
#include "runtime/stream_set.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <optional>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/streams.h"

namespace meshfuse {

namespace {

class CudaStreamSet final : public StreamSet {
 public:
  CudaStreamSet(int device, int64_t depth, bool timing, int sm_margin)
      : device_(device), caller_(cuda::currentStream(device)), previous_sm_target_(cuda::matmulSmCountTarget()) {
    cuda::DeviceGuard guard(device_);
    if (sm_margin > 0) {
      int sms = 0;
      MESHFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));
      cuda::setMatmulSmCountTarget(std::max(1, sms - sm_margin));
    }
    for (int64_t i = 0; i < depth; ++i) {
      cudaStream_t s = cuda::poolStream(device_, static_cast<int>(i));
      if (s == caller_) continue;  // a caller already on a pool stream keeps its own order
      cuda::streamWaitStream(device_, s, caller_);
      streams_.push_back(s);
    }
    if (streams_.empty()) streams_.push_back(caller_);
    if (timing) {
      // Drained, so that the base event runs now and mark times line up with the host clock.
      MESHFUSE_CUDA_CHECK(cudaStreamSynchronize(caller_));
      base_ = newEvent();
      MESHFUSE_CUDA_CHECK(cudaEventRecord(base_, caller_));
    }
  }

  ~CudaStreamSet() override {
    if (!joined_) {
      try {
        join();
      } catch (...) {  // a destructor during unwinding: the error that unwinds is the one to report
      }
    }
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
    if (base_) cudaEventDestroy(base_);
  }

  void enter(int64_t chunk) override {
    current_.reset();  // restores the caller's stream before switching
    current_.emplace(device_, streams_[static_cast<size_t>(chunk) % streams_.size()]);
  }

  void join() override {
    current_.reset();
    cuda::setMatmulSmCountTarget(previous_sm_target_);
    for (cudaStream_t s : streams_) cuda::streamWaitStream(device_, caller_, s);
    joined_ = true;
  }

  int mark() override {
    if (!base_) return -1;
    cudaEvent_t e = newEvent();
    MESHFUSE_CUDA_CHECK(cudaEventRecord(e, cuda::currentStream(device_)));
    marks_.push_back(e);
    return static_cast<int>(marks_.size()) - 1;
  }

  std::vector<double> markTimesUs(double created_us) override {
    std::vector<double> times;
    if (!base_) return times;
    cuda::DeviceGuard guard(device_);
    for (cudaEvent_t e : marks_) {
      MESHFUSE_CUDA_CHECK(cudaEventSynchronize(e));
      float ms = 0;
      MESHFUSE_CUDA_CHECK(cudaEventElapsedTime(&ms, base_, e));
      times.push_back(created_us + 1000.0 * ms);
    }
    return times;
  }

 private:
  cudaEvent_t newEvent() {
    cudaEvent_t e = nullptr;
    MESHFUSE_CUDA_CHECK(cudaEventCreate(&e));  // timing enabled
    return e;
  }

  int device_;
  cudaStream_t caller_;
  std::vector<cudaStream_t> streams_;
  std::optional<cuda::CurrentStreamGuard> current_;
  cudaEvent_t base_ = nullptr;
  std::vector<cudaEvent_t> marks_;
  int previous_sm_target_;
  bool joined_ = false;
};

const bool registered = registerStreamSetFactory([](Device device, int64_t depth, bool timing, int sm_margin) {
  if (device.type != DeviceType::CUDA) return std::unique_ptr<StreamSet>();
  return std::unique_ptr<StreamSet>(std::make_unique<CudaStreamSet>(device.index, depth, timing, sm_margin));
});

}  // namespace

}  // namespace meshfuse

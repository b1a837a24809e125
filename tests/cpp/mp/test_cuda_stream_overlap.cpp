// ParallelType::stream on CUDA tensors: allgather + linear and linear + reduce-scatter pipelined
// over s chunks equal the float64 reference, for s in {1, 2, 4, 8} and 1 to 3 streams, on every
// backend that carries CUDA tensors: CUDA IPC and NCCL queue each chunk on its own stream (the
// asynchronous path of host_ir/stream_loop.cpp), MPI stages through the host. Ranks share the
// machine's GPUs; NCCL needs one GPU per rank and is skipped (with the reason) where there are
// fewer. Skipped without a GPU.
#include <gtest/gtest.h>

#if MESHFUSE_HAVE_CUDA
#include "host_ir/fusion_executor.h"
#include "mp_test_utils.h"
#include "multidevice/communicator.h"
#include "ops/ops.h"
#include "runtime/cuda/streams.h"
#include "stream_overlap_fusions.h"

namespace meshfuse {
namespace {

using testing::expectClose;
using testing::linearReference;
using testing::randomTensor;
using testing::shardOf;

// (backend, chunks, number_of_streams)
using Param = std::tuple<CommunicatorBackend, int64_t, int64_t>;

class CudaStreamOverlap : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    std::string why;
    const int gpus = cuda::deviceCount(&why);
    if (gpus == 0) GTEST_SKIP() << "no CUDA device: " << why;
    backend_ = std::get<0>(GetParam());
    if (backend_ == CommunicatorBackend::Nccl && !MESHFUSE_HAVE_NCCL) GTEST_SKIP() << "built without NCCL";
    if (backend_ == CommunicatorBackend::Nccl && gpus < n)
      GTEST_SKIP() << "NCCL needs one GPU per rank: " << n << " ranks, " << gpus << " GPU(s)";
    device_ = Device::cuda(static_cast<int>(comm.localRank() % gpus));
    params_.lower.communicator_backend = backend_;
    params_.executor.number_of_streams = std::get<2>(GetParam());
  }
  Tensor onDevice(const Tensor& t) const { return t.to(DataType::Float).to(device_); }
  std::string what(const char* pattern) const {
    return std::string(pattern) + " on " + toString(backend_) + ", s=" + std::to_string(std::get<1>(GetParam())) +
           ", streams=" + std::to_string(std::get<2>(GetParam())) + ", rank " + std::to_string(rank);
  }

  Communicator& comm = Communicator::instance();
  int64_t rank = comm.rank();
  int64_t n = comm.size();
  CommunicatorBackend backend_ = CommunicatorBackend::Auto;
  Device device_;
  MultiDeviceExecutorParams params_;
};

// fp32 matmuls on the GPU may use TF32 (10-bit mantissa): k = 64 products of N(0,1) values.
constexpr double kTolerance = 2e-2;

TEST_P(CudaStreamOverlap, AllgatherThenLinear) {
  const int64_t s = std::get<1>(GetParam()), rows = 16 * n, k = 64, cols = 8 * n;
  auto f = testing::allgatherLinearFusion(rows, k, cols, s, /*bias=*/false);
  Tensor xf = randomTensor({rows, k}, 301 + s), wf = randomTensor({cols, k}, 302 + s);
  FusionExecutorCache fec(f);
  for (int repeat = 0; repeat < 2; ++repeat) {  // the second run reuses cached blocks and plans
    auto out = fec.execute({onDevice(shardOf(xf, 0, n, rank)), onDevice(shardOf(wf, 0, n, rank))}, params_);
    ASSERT_EQ(out[0].device(), device_) << what("allgather+linear");
    expectClose(out[0].to(Device::cpu()), shardOf(linearReference(xf, wf), 1, n, rank), kTolerance,
                what("allgather+linear"));
  }
  EXPECT_NE(fec.lastHostIr().find("ForLoop"), std::string::npos) << fec.lastHostIr();
}

TEST_P(CudaStreamOverlap, LinearThenReduceScatter) {
  if (backend_ == CommunicatorBackend::Cuda) GTEST_SKIP() << "the cuda backend has no reduce-scatter";
  const int64_t s = std::get<1>(GetParam()), rows = 16 * n, k = 16 * n, cols = 24;
  auto f = testing::linearReduceScatterFusion(rows, k, cols, s);
  Tensor hf = randomTensor({rows, k}, 311 + s), wf = randomTensor({cols, k}, 312 + s);
  FusionExecutorCache fec(f);
  for (int repeat = 0; repeat < 2; ++repeat) {
    auto out = fec.execute({onDevice(shardOf(hf, 1, n, rank)), onDevice(shardOf(wf, 1, n, rank))}, params_);
    expectClose(out[0].to(Device::cpu()), shardOf(linearReference(hf, wf), 0, n, rank), kTolerance,
                what("linear+reduce-scatter"));
  }
  EXPECT_NE(fec.lastHostIr().find("ForLoop"), std::string::npos) << fec.lastHostIr();
}

std::string paramName(const ::testing::TestParamInfo<Param>& info) {
  return toString(std::get<0>(info.param)) + "_s" + std::to_string(std::get<1>(info.param)) + "_streams" +
         std::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, CudaStreamOverlap,
                         ::testing::Combine(::testing::Values(CommunicatorBackend::Cuda, CommunicatorBackend::Nccl,
                                                              CommunicatorBackend::Mpi),
                                            ::testing::Values(1, 2, 4, 8), ::testing::Values(1, 3)),
                         paramName);

}  // namespace
}  // namespace meshfuse
#endif

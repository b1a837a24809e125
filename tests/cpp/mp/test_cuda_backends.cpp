// Backends on CUDA tensors under mpirun (every rank shares the machine's GPUs, several ranks per
// GPU on a one-GPU machine): the MPI backend staging device tensors through the host, the CUDA IPC
// backend (allgather, broadcast, send/recv by copy engine between the ranks' device buffers) on
// the world, the reversed world and two parity sub-teams, and NCCL on teams of one (NCCL allows
// one rank per GPU), and UCC on CUDA memory where UCC was built with CUDA. Every rank checks its result against the
// contributions it recomputes. Skipped without a GPU.
#include <gtest/gtest.h>

#if MESHFUSE_HAVE_CUDA
#include "backend_test_utils.h"
#include "runtime/cuda/streams.h"
#if MESHFUSE_HAVE_NCCL
#include "backends/nccl/nccl_backend.h"
#endif
#include "backends/cuda_ipc/cuda_ipc_backend.h"

namespace meshfuse {
namespace {

using namespace meshfuse::testing;

#define SKIP_WITHOUT_GPU()                                                         \
  do {                                                                             \
    std::string why_;                                                              \
    if (cuda::deviceCount(&why_) == 0) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)

Device myDevice() { return Device::cuda(static_cast<int>(Communicator::instance().localRank() % cuda::deviceCount())); }

Tensor deviceTensorOf(const std::vector<double>& values, DataType dtype) {
  return tensorOf(values, dtype).to(myDevice());
}
Tensor deviceZeros(int64_t n, DataType dtype) { return Tensor::zeros({n}, dtype, myDevice()); }
Tensor host(const Tensor& t) { return t.to(Device::cpu()); }

using Param = std::tuple<CommunicatorBackend, DataType, TeamKind>;

class CudaTensorCollectives : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    dtype_ = std::get<1>(GetParam());
    team_ = teamOf(std::get<2>(GetParam()));
    backend_ = &Communicator::instance().backend(std::get<0>(GetParam()), team_);
    n_ = backend_->teamSize();
    me_ = backend_->rankInTeam();
    seed_ = std::hash<std::string>{}(::testing::UnitTest::GetInstance()->current_test_info()->name()) % 100000;
  }
  std::vector<std::vector<double>> everyone(uint64_t seed, int64_t numel) const {
    std::vector<std::vector<double>> all;
    for (int64_t r = 0; r < n_; ++r) all.push_back(contribution(seed, r, numel, dtype_));
    return all;
  }
  std::string where(const std::string& op) const {
    return toString(backend_->type()) + " " + op + " " + toString(dtype_) + " on team " + teamToString(team_) +
           " at team rank " + std::to_string(me_);
  }
  // MPI (staging) and UCC (built with CUDA) also carry host tensors and have every collective.
  bool isMpi() const {
    return backend_->type() == CommunicatorBackend::Mpi || backend_->type() == CommunicatorBackend::Ucc;
  }

  DataType dtype_ = DataType::Float;
  std::vector<int64_t> team_;
  Backend* backend_ = nullptr;
  int64_t n_ = 1, me_ = 0;
  uint64_t seed_ = 0;
};

TEST_P(CudaTensorCollectives, AllgatherOfGrowingSizes) {
  // 3 elements to 2M elements: the CUDA IPC staging buffer grows (and is re-published) on the way.
  for (int64_t block : {3, 1000, 300000, 2000000}) {
    auto all = everyone(seed_ + static_cast<uint64_t>(block), block);
    Tensor input = deviceTensorOf(all[me_], dtype_);
    Tensor output = deviceZeros(n_ * block, dtype_);
    backend_->allgather(input, output)->wait(kWait);
    expectExact(host(output), concat(all), where("allgather of " + std::to_string(block)));
  }
}

TEST_P(CudaTensorCollectives, BackToBackAllgathersWithoutWaiting) {
  // Five operations queued before any wait: the stream and the staging events order them.
  const int64_t block = 4097;
  std::vector<std::vector<std::vector<double>>> all;
  std::vector<Tensor> inputs, outputs;
  std::vector<std::unique_ptr<Work>> works;
  for (int i = 0; i < 5; ++i) {
    all.push_back(everyone(seed_ + 17 * i, block));
    inputs.push_back(deviceTensorOf(all.back()[me_], dtype_));
    outputs.push_back(deviceZeros(n_ * block, dtype_));
    works.push_back(backend_->allgather(inputs.back(), outputs.back()));
  }
  for (int i = 0; i < 5; ++i) {
    works[i]->wait(kWait);
    expectExact(host(outputs[i]), concat(all[i]), where("queued allgather " + std::to_string(i)));
  }
}

TEST_P(CudaTensorCollectives, BroadcastFromEveryRoot) {
  for (int64_t root = 0; root < n_; ++root) {
    auto all = everyone(seed_ + static_cast<uint64_t>(root), 5000);
    Tensor t = me_ == root ? deviceTensorOf(all[root], dtype_) : deviceZeros(5000, dtype_);
    backend_->broadcast(t, root)->wait(kWait);
    expectExact(host(t), all[root], where("broadcast from " + std::to_string(root)));
  }
}

TEST_P(CudaTensorCollectives, SendRecvAroundTheRing) {
  if (n_ == 1) GTEST_SKIP() << "a ring needs two ranks (a team of one has no peer to send to)";
  auto all = everyone(seed_, 12345);
  const int64_t next = (me_ + 1) % n_, prev = (me_ + n_ - 1) % n_;
  Tensor out = deviceTensorOf(all[me_], dtype_);
  Tensor in = deviceZeros(12345, dtype_);
  // Even ranks send first, odd ranks receive first: the point-to-point exchanges pair up.
  std::unique_ptr<Work> a, b;
  if (me_ % 2 == 0) {
    a = backend_->send(out, next);
    b = backend_->recv(in, prev);
  } else {
    b = backend_->recv(in, prev);
    a = backend_->send(out, next);
  }
  a->wait(kWait);
  b->wait(kWait);
  expectExact(host(in), all[prev], where("recv from " + std::to_string(prev)));
}

TEST_P(CudaTensorCollectives, AllreduceWhereSupported) {
  auto all = everyone(seed_, 999);
  Tensor t = deviceTensorOf(all[me_], dtype_);
  if (!isMpi()) {
    try {
      backend_->allreduce(t, ReduceOp::Sum);
      FAIL() << "the cuda backend has no allreduce";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("not supported by the cuda backend"), std::string::npos) << e.what();
    }
    return;
  }
  backend_->allreduce(t, ReduceOp::Sum)->wait(kWait);
  Reduced ref = reduceReference(all, ReduceOp::Sum, dtype_);
  expectValues(host(t), ref.value, ref.tolerance, where("allreduce"));
}

TEST_P(CudaTensorCollectives, HostTensorsAreRejectedByDeviceBackends) {
  if (isMpi()) GTEST_SKIP() << "MPI and UCC carry host tensors";
  Tensor h = Tensor::zeros({4}, dtype_), out = Tensor::zeros({4 * n_}, dtype_);
  EXPECT_THROW(backend_->allgather(h, out), std::invalid_argument);
}

std::string paramName(const ::testing::TestParamInfo<Param>& info) {
  static const char* kTeams[] = {"world", "reversed", "parity"};
  return toString(std::get<0>(info.param)) + "_" + toString(std::get<1>(info.param)) + "_" +
         kTeams[static_cast<int>(std::get<2>(info.param))];
}

INSTANTIATE_TEST_SUITE_P(MpiStagingAndCudaIpc, CudaTensorCollectives,
                         ::testing::Combine(::testing::Values(CommunicatorBackend::Mpi, CommunicatorBackend::Cuda),
                                            ::testing::Values(DataType::Float, DataType::Half, DataType::Int),
                                            ::testing::Values(TeamKind::World, TeamKind::Reversed, TeamKind::Parity)),
                         paramName);

#if MESHFUSE_HAVE_UCC && MESHFUSE_UCC_CUDA  // UCC built with CUDA (scripts/build-ucc --cuda): CUDA memory directly
INSTANTIATE_TEST_SUITE_P(UccCudaMemory, CudaTensorCollectives,
                         ::testing::Combine(::testing::Values(CommunicatorBackend::Ucc),
                                            ::testing::Values(DataType::Float, DataType::Half, DataType::Int),
                                            ::testing::Values(TeamKind::World, TeamKind::Reversed, TeamKind::Parity)),
                         paramName);
#endif

#if MESHFUSE_HAVE_NCCL
// NCCL on a team of one (each rank its own team, all at once): every operation is enqueued on
// the current stream and its result checked.
class NcclTeamOfOne : public ::testing::TestWithParam<DataType> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    dtype_ = GetParam();
    backend_ = &Communicator::instance().backend(CommunicatorBackend::Nccl, {Communicator::instance().rank()});
  }
  std::vector<double> data(uint64_t seed, int64_t n, ReduceOp op = ReduceOp::Sum) const {
    return contribution(seed, Communicator::instance().rank(), n, dtype_, op);
  }
  DataType dtype_ = DataType::Float;
  Backend* backend_ = nullptr;
};

TEST_P(NcclTeamOfOne, EveryOperation) {
  const std::string dt = toString(dtype_);
  {
    auto v = data(1, 777);
    Tensor in = deviceTensorOf(v, dtype_), out = deviceZeros(777, dtype_);
    backend_->allgather(in, out)->wait(kWait);
    expectExact(host(out), v, "nccl allgather " + dt);
  }
  for (ReduceOp op : kOps) {
    auto v = data(2, 500, op);
    Tensor t = deviceTensorOf(v, dtype_);
    backend_->allreduce(t, op)->wait(kWait);
    expectExact(host(t), v, "nccl allreduce " + toString(op) + " " + dt);
    Tensor out = deviceZeros(500, dtype_);
    backend_->reduceScatter(deviceTensorOf(v, dtype_), out, op)->wait(kWait);
    expectExact(host(out), v, "nccl reduce_scatter " + toString(op) + " " + dt);
    Tensor red = deviceZeros(500, dtype_);
    backend_->reduce(deviceTensorOf(v, dtype_), red, 0, op)->wait(kWait);
    expectExact(host(red), v, "nccl reduce " + toString(op) + " " + dt);
  }
  {
    auto v = data(3, 64);
    Tensor t = deviceTensorOf(v, dtype_);
    backend_->broadcast(t, 0)->wait(kWait);
    expectExact(host(t), v, "nccl broadcast " + dt);
    Tensor g = deviceZeros(64, dtype_), s = deviceZeros(64, dtype_), a = deviceZeros(64, dtype_);
    backend_->gather(deviceTensorOf(v, dtype_), g, 0)->wait(kWait);
    expectExact(host(g), v, "nccl gather " + dt);
    backend_->scatter(deviceTensorOf(v, dtype_), s, 0)->wait(kWait);
    expectExact(host(s), v, "nccl scatter " + dt);
    backend_->allToAll(deviceTensorOf(v, dtype_), a)->wait(kWait);
    expectExact(host(a), v, "nccl all_to_all " + dt);
    backend_->barrier()->wait(kWait);
  }
  Tensor h = Tensor::zeros({4}, dtype_);
  try {
    backend_->allreduce(h, ReduceOp::Sum);
    FAIL() << "NCCL must refuse host tensors";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("host tensor"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(backend_->supports(Device::cpu()));
  EXPECT_TRUE(backend_->supports(myDevice()));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NcclTeamOfOne,
                         ::testing::Values(DataType::Float, DataType::Double, DataType::Half, DataType::BFloat16,
                                           DataType::Int, DataType::Int32),
                         [](const auto& info) { return toString(info.param); });
#endif  // MESHFUSE_HAVE_NCCL

}  // namespace
}  // namespace meshfuse
#endif  // MESHFUSE_HAVE_CUDA

// The Communicator without a launcher: an Open MPI singleton, a world of one process. (Under
// mpirun these tests skip; tests/cpp/mp/ covers the multi-rank case.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <optional>
#include <random>

#include "backends/backend.h"
#include "multidevice/communicator.h"
#include "runtime/device_count.h"

namespace meshfuse {
namespace {

class SingletonCommunicator : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Communicator::instance().size() != 1) GTEST_SKIP() << "run without mpirun for the singleton world";
  }
  Communicator& comm() { return Communicator::instance(); }
};

TEST(BackendNames, MatchPythonNames) {
  EXPECT_EQ(toString(CommunicatorBackend::Auto), "auto");
  EXPECT_EQ(toString(CommunicatorBackend::Nccl), "nccl");
  EXPECT_EQ(toString(CommunicatorBackend::Ucc), "ucc");
  EXPECT_EQ(toString(CommunicatorBackend::Mpi), "mpi");
  EXPECT_EQ(toString(CommunicatorBackend::Gloo), "gloo");
  EXPECT_EQ(toString(CommunicatorBackend::Cuda), "cuda");
  EXPECT_EQ(toString(ReduceOp::Sum), "sum");
  EXPECT_EQ(toString(ReduceOp::Prod), "prod");
  EXPECT_EQ(toString(ReduceOp::Max), "max");
  EXPECT_EQ(toString(ReduceOp::Min), "min");
  EXPECT_EQ(teamToString({0, 2, 3}), "[0, 2, 3]");
  EXPECT_TRUE(completedWork()->test());
}

TEST_F(SingletonCommunicator, WorldOfOne) {
  EXPECT_EQ(comm().rank(), 0);
  EXPECT_EQ(comm().size(), 1);
  EXPECT_EQ(comm().localRank(), 0);
  EXPECT_EQ(comm().localSize(), 1);
  comm().barrier();
}

TEST_F(SingletonCommunicator, MpiIsAlwaysAvailableAndAutoResolvesToIt) {
  auto available = comm().availableBackends();
  EXPECT_NE(std::find(available.begin(), available.end(), CommunicatorBackend::Mpi), available.end());
  EXPECT_TRUE(comm().isAvailable(CommunicatorBackend::Mpi));
  EXPECT_EQ(comm().isAvailable(CommunicatorBackend::Ucc), bool(MESHFUSE_HAVE_UCC));  // built when UCC was found
  EXPECT_EQ(comm().resolve(CommunicatorBackend::Auto, Device::cpu()), CommunicatorBackend::Mpi);
  EXPECT_EQ(comm().resolve(CommunicatorBackend::Gloo, Device::cpu()), CommunicatorBackend::Gloo);
  // A world of one: NCCL where it is built and this process sees a GPU, else MPI.
  const auto for_cuda = comm().resolve(CommunicatorBackend::Auto, Device::cuda(0));
  const bool nccl = comm().isAvailable(CommunicatorBackend::Nccl) && cudaDeviceCountOrZero() >= 1;
  EXPECT_EQ(for_cuda, nccl ? CommunicatorBackend::Nccl : CommunicatorBackend::Mpi);
}

TEST_F(SingletonCommunicator, BackendOnTeamOfOneComputes) {
  Backend& mpi = comm().backend(CommunicatorBackend::Mpi, {0});
  EXPECT_EQ(&mpi, &comm().backend(CommunicatorBackend::Mpi, {0}));  // cached
  EXPECT_EQ(mpi.type(), CommunicatorBackend::Mpi);
  EXPECT_EQ(mpi.rankInTeam(), 0);
  EXPECT_EQ(mpi.teamSize(), 1);

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  Tensor x = Tensor::empty({5, 3}, DataType::Float);
  for (int64_t i = 0; i < x.numel(); ++i) x.dataAs<float>()[i] = dist(rng);
  Tensor expected = x.clone();

  Tensor gathered = Tensor::empty({15}, DataType::Float);
  mpi.allgather(x, gathered)->wait(std::chrono::seconds(10));
  mpi.allreduce(x, ReduceOp::Sum)->wait(std::chrono::seconds(10));
  for (int64_t i = 0; i < x.numel(); ++i) {
    EXPECT_EQ(gathered.item(i), expected.item(i)) << "allgather element " << i;
    EXPECT_EQ(x.item(i), expected.item(i)) << "allreduce element " << i;
  }
  mpi.barrier()->wait(std::chrono::seconds(10));
}

TEST_F(SingletonCommunicator, UnknownBackendErrorListsAvailableOnes) {
  std::optional<CommunicatorBackend> missing;
  for (CommunicatorBackend b :
       {CommunicatorBackend::Ucc, CommunicatorBackend::Gloo, CommunicatorBackend::Nccl, CommunicatorBackend::Cuda})
    if (!missing && !comm().isAvailable(b)) missing = b;
  if (!missing) GTEST_SKIP() << "every backend is built here";
  try {
    comm().backend(*missing, {0});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(
        what.find("communicator backend '" + toString(*missing) + "' is not available in this build; available: "),
        std::string::npos)
        << what;
    EXPECT_NE(what.find("mpi"), std::string::npos) << what;
  }
}

TEST_F(SingletonCommunicator, BadTeamsAreRejected) {
  EXPECT_THROW(comm().backend(CommunicatorBackend::Mpi, {}), std::invalid_argument);
  EXPECT_THROW(comm().backend(CommunicatorBackend::Mpi, {1}), std::invalid_argument);
  EXPECT_THROW(comm().backend(CommunicatorBackend::Mpi, {0, 0}), std::invalid_argument);
  EXPECT_THROW(comm().backend(CommunicatorBackend::Auto, {0}), std::invalid_argument);
}

TEST_F(SingletonCommunicator, AllgatherBytesReturnsOwnBytes) {
  auto all = comm().allgatherBytes({0}, std::string("hello\0world", 11), std::chrono::seconds(10));
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0], std::string("hello\0world", 11));
}

TEST_F(SingletonCommunicator, RecvWithoutSenderTimesOut) {
  Backend& mpi = comm().backend(CommunicatorBackend::Mpi, {0});
  Tensor t = Tensor::zeros({4}, DataType::Int32);
  auto work = mpi.recv(t, 0);
  EXPECT_FALSE(work->test());
  EXPECT_THROW(work->wait(std::chrono::milliseconds(100)), CommunicationTimeout);
}

}  // namespace
}  // namespace meshfuse

namespace meshfuse {
namespace {

TEST(AutoBackend, NcclOnlyWhenNoTwoMembersShareAGpuElseMpi) {
  using B = CommunicatorBackend;
  EXPECT_EQ(chooseAutoBackend(DeviceType::CPU, true, false), B::Mpi);
  EXPECT_EQ(chooseAutoBackend(DeviceType::CUDA, true, false), B::Nccl);
  EXPECT_EQ(chooseAutoBackend(DeviceType::CUDA, true, true), B::Mpi);    // members sharing one GPU
  EXPECT_EQ(chooseAutoBackend(DeviceType::CUDA, false, false), B::Mpi);  // a build without NCCL
}

// Two nodes: ranks 0, 1, 4 on "a", ranks 2, 3 on "b" (leaders 0 and 2).
NodeTopology twoNodes() { return NodeTopology({0, 0, 2, 2, 0}, {"a", "", "b", "", ""}); }

TEST(NodeTopology, NodesAndLocalRanksFollowTheLowestRankOfEachNode) {
  const NodeTopology t = twoNodes();
  EXPECT_EQ(t.nodeCount(), 2);
  EXPECT_EQ(t.nodeName(0), "a");
  EXPECT_EQ(t.nodeName(1), "b");
  const int64_t node[] = {0, 0, 1, 1, 0}, local[] = {0, 1, 0, 1, 2}, local_size[] = {3, 3, 2, 2, 3};
  for (int64_t r = 0; r < 5; ++r) {
    EXPECT_EQ(t.nodeOf(r), node[r]) << "rank " << r;
    EXPECT_EQ(t.localRankOf(r), local[r]) << "rank " << r;
    EXPECT_EQ(t.localSizeOf(r), local_size[r]) << "rank " << r;
  }
  EXPECT_EQ(t.nodesOf({3, 0, 2}), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(t.describe({3, 0, 2}), "ranks 3, 2 on node 1 (b); rank 0 on node 0 (a)");
}

TEST(NodeTopology, TeamMembersShareAGpuByLocalRankModuloGpus) {
  const NodeTopology t = twoNodes();
  EXPECT_FALSE(t.membersShareAGpu({0, 1, 2, 3}, 2));  // two GPUs a node: one each
  EXPECT_TRUE(t.membersShareAGpu({0, 4}, 2));         // local ranks 0 and 2 on two GPUs
  EXPECT_FALSE(t.membersShareAGpu({0, 1, 4}, 3));
  EXPECT_FALSE(t.membersShareAGpu({0, 2}, 1));  // GPU 0 of different nodes
  EXPECT_TRUE(t.membersShareAGpu({0}, 0));      // no GPU at all
}

TEST_F(SingletonCommunicator, AWorldOfOneIsOneNodeNamedByItsHost) {
  EXPECT_EQ(comm().nodeId(), 0);
  EXPECT_EQ(comm().nodeCount(), 1);
  char host[65] = {};
  gethostname(host, 64);
  EXPECT_EQ(comm().nodes().nodeName(0), host);
}

}  // namespace
}  // namespace meshfuse

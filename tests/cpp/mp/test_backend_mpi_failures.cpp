// The MPI backend at its edges: waits that time out (and leave the backend usable), arguments
// rejected before any communication, and tensors larger than one MPI call carries (split into
// several calls; the limit is lowered so the test stays small).
#include <gtest/gtest.h>

#include <numeric>
#include <thread>

#include "backends/backend.h"
#include "backends/mpi/mpi_backend.h"
#include "multidevice/communicator.h"

namespace meshfuse {
namespace {

constexpr std::chrono::seconds kWait(60);

std::vector<int64_t> world() {
  std::vector<int64_t> team(static_cast<size_t>(Communicator::instance().size()));
  std::iota(team.begin(), team.end(), 0);
  return team;
}

Backend& worldMpi() { return Communicator::instance().backend(CommunicatorBackend::Mpi, world()); }

// Element i of rank r's tensor: distinct across ranks and positions.
Tensor iota(int64_t numel, int64_t rank, DataType dtype = DataType::Float) {
  Tensor t = Tensor::empty({numel}, DataType::Double);
  for (int64_t i = 0; i < numel; ++i) t.dataAs<double>()[i] = static_cast<double>(rank * 1000 + i);
  return t.to(dtype);
}

template <typename F>
std::string invalidArgumentMessage(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument thrown)";
}

TEST(MpiBackendTimeout, RecvThatNobodySendsTimesOutAndIsCancelled) {
  Backend& mpi = worldMpi();
  const int64_t n = mpi.teamSize(), me = mpi.rankInTeam();
  // The analyzer follows FAIL()'s return out of the try below and calls prev and start unread.
  const int64_t next = (me + 1) % n, prev = (me + n - 1) % n;  // NOLINT(clang-analyzer-deadcode.DeadStores)
  Tensor lost = Tensor::zeros({16}, DataType::Int32);
  auto work = mpi.recv(lost, next);                     // nobody sends to me now
  const auto start = std::chrono::steady_clock::now();  // NOLINT(clang-analyzer-deadcode.DeadStores)
  try {
    work->wait(std::chrono::milliseconds(200));
    FAIL() << "expected CommunicationTimeout";
  } catch (const CommunicationTimeout& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("mpi recv from team rank " + std::to_string(next)), std::string::npos) << what;
    EXPECT_NE(what.find("team " + teamToString(world())), std::string::npos) << what;
    EXPECT_NE(what.find("waited"), std::string::npos) << what;
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(200));
  EXPECT_LT(waited, std::chrono::seconds(5));

  // The cancelled receive must not swallow a later message from the same peer on the same tag:
  // once every rank has cancelled (the barrier), `next` really sends to me.
  Backend& again = worldMpi();
  again.barrier()->wait(kWait);
  Tensor payload = iota(16, me, DataType::Int32);
  Tensor got = Tensor::zeros({16}, DataType::Int32);
  auto receiving = again.recv(got, next);
  auto sending = again.send(payload, prev);
  receiving->wait(kWait);
  sending->wait(kWait);
  Tensor expected = iota(16, next, DataType::Int32);
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(got.item(i), expected.item(i)) << "element " << i;
  EXPECT_EQ(lost.item(0), 0) << "the cancelled receive wrote into its buffer";
  again.barrier()->wait(kWait);
}

TEST(MpiBackendTimeout, BarrierWaitsForTheLastRank) {
  Backend& mpi = worldMpi();
  mpi.barrier()->wait(kWait);
  const auto start = std::chrono::steady_clock::now();
  if (mpi.rankInTeam() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  mpi.barrier()->wait(kWait);
  // Every rank left the barrier only after rank 0 arrived, 300 ms in.
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(290));
}

TEST(MpiBackendArguments, SizeDtypeRootAndLayoutErrorsNameTheNumbers) {
  Backend& mpi = worldMpi();
  const int64_t n = mpi.teamSize();
  Tensor in = Tensor::zeros({4}, DataType::Float);
  Tensor wrong_size = Tensor::zeros({4 * n + 1}, DataType::Float);
  Tensor wrong_dtype = Tensor::zeros({4 * n}, DataType::Double);

  std::string msg = invalidArgumentMessage([&] { mpi.allgather(in, wrong_size); });
  EXPECT_NE(msg.find("output has " + std::to_string(4 * n + 1) + " elements, expected " + std::to_string(4 * n)),
            std::string::npos)
      << msg;
  msg = invalidArgumentMessage([&] { mpi.allgather(in, wrong_dtype); });
  EXPECT_NE(msg.find("Double"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Float"), std::string::npos) << msg;
  msg = invalidArgumentMessage([&] { mpi.reduceScatter(wrong_size, in, ReduceOp::Sum); });
  EXPECT_NE(msg.find("input has " + std::to_string(4 * n + 1)), std::string::npos) << msg;
  msg = invalidArgumentMessage([&] { mpi.broadcast(in, n); });
  EXPECT_NE(msg.find("root " + std::to_string(n) + " is not a team rank"), std::string::npos) << msg;
  msg = invalidArgumentMessage([&] { mpi.send(in, -1); });
  EXPECT_NE(msg.find("peer -1"), std::string::npos) << msg;

  Tensor matrix = Tensor::zeros({3, 2}, DataType::Float);
  Tensor transposed = matrix.permute({1, 0});
  msg = invalidArgumentMessage([&] { mpi.allreduce(transposed, ReduceOp::Sum); });
  EXPECT_NE(msg.find("not contiguous"), std::string::npos) << msg;
  Tensor undefined;
  msg = invalidArgumentMessage([&] { mpi.allreduce(undefined, ReduceOp::Sum); });
  EXPECT_NE(msg.find("undefined"), std::string::npos) << msg;

  if (n > 1) {
    Tensor odd = Tensor::zeros({n + 1}, DataType::Float);
    Tensor odd_out = Tensor::zeros({n + 1}, DataType::Float);
    msg = invalidArgumentMessage([&] { mpi.allToAll(odd, odd_out); });
    EXPECT_NE(msg.find("not divisible by the team size " + std::to_string(n)), std::string::npos) << msg;
  }
  // Nothing was started, so the backend is still in step on every rank.
  mpi.barrier()->wait(kWait);
}

// A backend whose calls carry at most 7 elements: larger tensors go in several MPI calls.
class MpiBackendChunks : public ::testing::Test {
 protected:
  static constexpr int64_t kMaxCount = 7;
  static constexpr int64_t kNumel = 50;  // 8 calls, the last one short
  MpiBackendChunks() : backend_(Communicator::instance(), world(), kMaxCount) {}
  MpiBackend backend_;
  int64_t n() const { return backend_.teamSize(); }
  int64_t me() const { return backend_.rankInTeam(); }
};

TEST_F(MpiBackendChunks, AllreduceReduceBroadcastSendRecvSplitLargeTensors) {
  Tensor sum = iota(kNumel, me(), DataType::Double);
  backend_.allreduce(sum, ReduceOp::Sum)->wait(kWait);
  for (int64_t i = 0; i < kNumel; ++i) {
    double expected = 0;
    for (int64_t r = 0; r < n(); ++r) expected += static_cast<double>(r * 1000 + i);
    ASSERT_EQ(sum.item(i), expected) << "allreduce element " << i;
  }

  const int64_t root = n() - 1;
  Tensor input = iota(kNumel, me(), DataType::Int);
  Tensor maximum = Tensor::zeros({kNumel}, DataType::Int);
  backend_.reduce(input, maximum, root, ReduceOp::Max)->wait(kWait);
  if (me() == root)
    for (int64_t i = 0; i < kNumel; ++i) ASSERT_EQ(maximum.item(i), (n() - 1) * 1000 + i) << "reduce element " << i;

  Tensor b = me() == root ? iota(kNumel, root, DataType::Half) : Tensor::zeros({kNumel}, DataType::Half);
  backend_.broadcast(b, root)->wait(kWait);
  Tensor expected_b = iota(kNumel, root, DataType::Half);
  for (int64_t i = 0; i < kNumel; ++i) ASSERT_EQ(b.item(i), expected_b.item(i)) << "broadcast element " << i;

  const int64_t next = (me() + 1) % n(), prev = (me() + n() - 1) % n();
  Tensor out = iota(kNumel, me(), DataType::Int32);
  Tensor in = Tensor::zeros({kNumel}, DataType::Int32);
  auto receiving = backend_.recv(in, prev);
  auto sending = backend_.send(out, next);
  receiving->wait(kWait);
  sending->wait(kWait);
  for (int64_t i = 0; i < kNumel; ++i) ASSERT_EQ(in.item(i), prev * 1000 + i) << "recv element " << i;
}

TEST_F(MpiBackendChunks, BlockwiseCollectivesRefuseBlocksBeyondTheLimit) {
  Tensor input = Tensor::zeros({kMaxCount + 1}, DataType::Float);
  Tensor output = Tensor::zeros({n() * (kMaxCount + 1)}, DataType::Float);
  std::string msg = invalidArgumentMessage([&] { backend_.allgather(input, output); });
  EXPECT_NE(
      msg.find("a block of " + std::to_string(kMaxCount + 1) + " elements exceeds the " + std::to_string(kMaxCount)),
      std::string::npos)
      << msg;
  msg = invalidArgumentMessage([&] { backend_.reduceScatter(output, input, ReduceOp::Sum); });
  EXPECT_NE(msg.find("exceeds"), std::string::npos) << msg;
  // At the limit it works.
  Tensor small = iota(kMaxCount, me());
  Tensor gathered = Tensor::zeros({n() * kMaxCount}, DataType::Float);
  backend_.allgather(small, gathered)->wait(kWait);
  for (int64_t r = 0; r < n(); ++r)
    for (int64_t i = 0; i < kMaxCount; ++i) ASSERT_EQ(gathered.item(r * kMaxCount + i), r * 1000 + i);
}

}  // namespace
}  // namespace meshfuse

// What is particular to the UCC backend (its collectives against the float64 reference, for every
// dtype and team, are in the shared suite of test_backend_mpi.cpp): registration and the team
// cache; waits that time out naming the operation, after which a late peer still completes the
// abandoned collective and the team goes on; receives nobody sends; point-to-point messages both
// ways at once, of sizes that take different UCC algorithms, matching in posting order; many
// operations in flight waited in any order; tensors of several MiB (pipelined, multi-fragment
// algorithms, Half reduced in float); arguments, CUDA memory included, rejected before any
// communication.
#include <gtest/gtest.h>

#include "backend_test_utils.h"
#include "backends/ucc/ucc_backend.h"

namespace meshfuse {
namespace {

using namespace meshfuse::testing;

Communicator& comm() { return Communicator::instance(); }
std::vector<int64_t> world() { return teamOf(TeamKind::World); }
Backend& worldUcc() { return comm().backend(CommunicatorBackend::Ucc, world()); }

std::vector<std::vector<double>> everyone(uint64_t seed, int64_t n, int64_t numel, DataType dtype,
                                          ReduceOp op = ReduceOp::Sum) {
  std::vector<std::vector<double>> all;
  for (int64_t r = 0; r < n; ++r) all.push_back(contribution(seed, r, numel, dtype, op));
  return all;
}

TEST(UccBackend, IsRegisteredAndServesTheCommunicatorsTeams) {
  auto available = comm().availableBackends();
  EXPECT_NE(std::find(available.begin(), available.end(), CommunicatorBackend::Ucc), available.end());
  Backend& ucc = worldUcc();
  EXPECT_EQ(ucc.type(), CommunicatorBackend::Ucc);
  EXPECT_EQ(ucc.team(), world());
  EXPECT_EQ(ucc.rankInTeam(), comm().rank());
  EXPECT_TRUE(ucc.supports(Device::cpu()));
  EXPECT_EQ(&ucc, &worldUcc()) << "one cached backend per (type, team)";
}

TEST(UccTimeout, ACollectiveTheOthersSkipTimesOutThenALatePeerCompletesIt) {
  if (comm().size() < 2) GTEST_SKIP() << "needs a peer that comes late";
  UccBackend ucc(comm(), world());  // a team of its own
  const int64_t n = ucc.teamSize(), me = ucc.rankInTeam();
  auto all = everyone(1200, n, 64, DataType::Float);
  Tensor t = tensorOf(all[me], DataType::Float);
  std::unique_ptr<Work> work;
  if (me != 0) {  // rank 0 does not come (yet)
    work = ucc.allreduce(t, ReduceOp::Sum);
    const auto start = std::chrono::steady_clock::now();
    const std::string msg = messageOf<CommunicationTimeout>([&] { work->wait(std::chrono::milliseconds(200)); });
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
    EXPECT_NE(msg.find("ucc allreduce(sum) (Float, 64 elements) on team " + teamToString(world())), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("timeout 200 ms"), std::string::npos) << msg;
    EXPECT_FALSE(work->test()) << "a timed-out operation is never done";
    const std::string again = messageOf<CommunicationTimeout>([&] { work->wait(kWait); });
    EXPECT_NE(again.find("abandoned after an earlier timeout"), std::string::npos) << again;
  }
  comm().barrier();
  if (me == 0) {
    // The others' allreduce is still posted (abandoned): rank 0's completes it, and the team goes on.
    ucc.allreduce(t, ReduceOp::Sum)->wait(kWait);
    expectValues(t, reduceReference(all, ReduceOp::Sum, DataType::Float).value,
                 reduceReference(all, ReduceOp::Sum, DataType::Float).tolerance, "the late peer's allreduce");
  }
  ucc.barrier()->wait(kWait);
  Tensor after = tensorOf(all[me], DataType::Float);
  ucc.allreduce(after, ReduceOp::Max)->wait(kWait);
  expectExact(after, reduceReference(all, ReduceOp::Max, DataType::Float).value, "an allreduce after the timeout");
}

TEST(UccTimeout, AReceiveNobodySendsTimesOutNamingIt) {
  // A team of its own, never destroyed: its abandoned receive stays posted for good.
  auto* ucc = new UccBackend(comm(), world());
  const int64_t me = ucc->rankInTeam(), peer = (me + 1) % ucc->teamSize();
  Tensor lost = Tensor::zeros({16}, DataType::Int32);
  auto work = ucc->recv(lost, peer);
  const std::string msg = messageOf<CommunicationTimeout>([&] { work->wait(std::chrono::milliseconds(100)); });
  EXPECT_NE(msg.find("ucc recv from team rank " + std::to_string(peer) + " (Int32, 16 elements)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("did not take part"), std::string::npos) << msg;
  comm().barrier();
}

TEST(UccPointToPoint, MessagesBothWaysAtOnceMatchInPostingOrder) {
  Backend& ucc = worldUcc();
  const int64_t n = ucc.teamSize(), me = ucc.rankInTeam();
  const int64_t next = (me + 1) % n, prev = (me + n - 1) % n;
  // Small and large messages (UCC picks different broadcast algorithms for them), several each way.
  const std::vector<int64_t> sizes = {5, 300000, 17, 1 << 20, 3};
  std::vector<Tensor> inbox;
  std::vector<std::unique_ptr<Work>> works;
  for (size_t i = 0; i < sizes.size(); ++i) {
    inbox.push_back(Tensor::zeros({sizes[i]}, DataType::Float));
    works.push_back(ucc.recv(inbox.back(), prev));
  }
  for (size_t i = 0; i < sizes.size(); ++i)
    works.push_back(ucc.send(tensorOf(contribution(1300 + i, me, sizes[i], DataType::Float), DataType::Float), next));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait(kWait);  // any order
  for (size_t i = 0; i < sizes.size(); ++i)
    expectExact(inbox[i], contribution(1300 + i, prev, sizes[i], DataType::Float),
                "message " + std::to_string(i) + " from team rank " + std::to_string(prev));
}

TEST(UccWorkOrder, ManyOperationsInFlightWaitedInReverse) {
  Backend& ucc = worldUcc();
  const int64_t n = ucc.teamSize(), me = ucc.rankInTeam();
  std::vector<std::vector<std::vector<double>>> all;
  std::vector<Tensor> tensors, gathered;
  std::vector<std::unique_ptr<Work>> works;
  for (int i = 0; i < 8; ++i) {
    all.push_back(everyone(1400 + i, n, 100 + i, DataType::Double));
    tensors.push_back(tensorOf(all.back()[me], DataType::Double));
    gathered.push_back(Tensor::zeros({n * (100 + i)}, DataType::Double));
    works.push_back(ucc.allgather(tensors.back(), gathered.back()));
    works.push_back(ucc.allreduce(tensors.back(), ReduceOp::Sum));
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait(kWait);
  for (int i = 0; i < 8; ++i) {
    expectExact(gathered[i], concat(all[i]), "allgather " + std::to_string(i));
    Reduced ref = reduceReference(all[i], ReduceOp::Sum, DataType::Double);
    expectValues(tensors[i], ref.value, ref.tolerance, "allreduce " + std::to_string(i));
  }
}

TEST(UccLarge, TensorsOfSeveralMiB) {
  Backend& ucc = worldUcc();
  const int64_t n = ucc.teamSize(), me = ucc.rankInTeam();
  const int64_t numel = (int64_t{1} << 21) + 7;  // 8 MiB of Float, a ragged end
  auto all = everyone(1500, n, numel, DataType::Float);
  Tensor t = tensorOf(all[me], DataType::Float);
  ucc.allreduce(t, ReduceOp::Sum)->wait(kWait);
  Reduced ref = reduceReference(all, ReduceOp::Sum, DataType::Float);
  expectValues(t, ref.value, ref.tolerance, "allreduce of 8 MiB");

  for (DataType dtype : {DataType::Half, DataType::BFloat16}) {  // Half: reduced in float (ucc_types.h)
    const int64_t block = (int64_t{1} << 19) + 3;
    auto inputs = everyone(1501, n, n * block, dtype);
    std::vector<std::vector<double>> mine;
    for (const auto& in : inputs) mine.push_back(slice(in, me * block, block));
    Tensor out = Tensor::zeros({block}, dtype);
    ucc.reduceScatter(tensorOf(inputs[me], dtype), out, ReduceOp::Sum)->wait(kWait);
    Reduced rs = reduceReference(mine, ReduceOp::Sum, dtype);
    expectValues(out, rs.value, rs.tolerance, "reduceScatter of 1 MiB blocks, " + toString(dtype));
  }

  Tensor gathered = Tensor::zeros({n * numel}, DataType::Float);
  ucc.allgather(tensorOf(all[me], DataType::Float), gathered)->wait(kWait);
  expectExact(gathered, concat(all), "allgather of 8 MiB blocks");
}

TEST(UccValidation, BadArgumentsThrowOnEveryRankBeforeAnyCommunication) {
  Backend& ucc = worldUcc();
  const int64_t n = ucc.teamSize();
  Tensor block = Tensor::zeros({4}, DataType::Float);
  std::string msg = messageOf<std::invalid_argument>([&] { ucc.allgather(block, block); });
  if (n > 1) EXPECT_NE(msg.find("ucc allgather: output has 4 elements"), std::string::npos) << msg;
  msg = messageOf<std::invalid_argument>([&] { ucc.broadcast(block, n); });
  EXPECT_NE(msg.find("ucc broadcast: root " + std::to_string(n) + " is not a team rank"), std::string::npos) << msg;
  Tensor doubles = Tensor::zeros({4 * n}, DataType::Double);
  msg = messageOf<std::invalid_argument>([&] { ucc.allgather(block, doubles); });
  EXPECT_NE(msg.find("the ucc backend does not convert"), std::string::npos) << msg;
  // A tensor in CUDA memory (never touched: the check comes first) in a UCC build without CUDA.
  float fake[4];
  Tensor on_gpu = Tensor::fromBlob(fake, DataType::Float, {4}, {1}, Device::cuda(0), [](void*) {});
  if (!ucc.supports(Device::cuda(0))) {
    msg = messageOf<std::invalid_argument>([&] { ucc.allreduce(on_gpu, ReduceOp::Sum); });
    EXPECT_NE(msg.find("ucc allreduce(sum): tensor is on cuda:0, but this UCC build carries host memory only"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("scripts/build-ucc --cuda"), std::string::npos) << msg;
  }
  // Nobody was left inside a collective: the next one works.
  auto all = everyone(1600, n, 6, DataType::Int);
  Tensor t = tensorOf(all[ucc.rankInTeam()], DataType::Int);
  ucc.allreduce(t, ReduceOp::Max)->wait(kWait);
  expectExact(t, reduceReference(all, ReduceOp::Max, DataType::Int).value, "allreduce after rejected calls");
}

}  // namespace
}  // namespace meshfuse

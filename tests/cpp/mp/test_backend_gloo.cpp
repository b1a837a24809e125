// What is particular to the Gloo backend (its collectives against the float64 reference, for
// every dtype and team, are in the shared suite of test_backend_mpi.cpp): the rendezvous over MPI
// (backends of one team connect independently; a rank without a TCP device fails every rank at
// once, naming itself); operations that run in posting
// order on the worker while their Works are waited for in any order; sends and receives that
// never queue behind a collective; messages to oneself; waits that time out naming the operation,
// and Gloo's own operation timeout when a peer never comes; arguments rejected before any
// communication; tensors of many Gloo segments.
#include <gtest/gtest.h>

#include <optional>

#include "backend_test_utils.h"
#include "backends/gloo/gloo_backend.h"
#include "scoped_env.h"

namespace meshfuse {
namespace {

using namespace meshfuse::testing;

Communicator& comm() { return Communicator::instance(); }
std::vector<int64_t> world() { return teamOf(TeamKind::World); }
Backend& worldGloo() { return comm().backend(CommunicatorBackend::Gloo, world()); }

TEST(GlooBackend, IsRegisteredAndServesTheCommunicatorsTeams) {
  const auto available = comm().availableBackends();
  EXPECT_NE(std::find(available.begin(), available.end(), CommunicatorBackend::Gloo), available.end());
  Backend& gloo = worldGloo();
  EXPECT_EQ(gloo.type(), CommunicatorBackend::Gloo);
  EXPECT_EQ(gloo.team(), world());
  EXPECT_EQ(gloo.rankInTeam(), comm().rank());
  EXPECT_TRUE(gloo.supports(Device::cpu()));
  EXPECT_EQ(&gloo, &worldGloo()) << "one cached backend per (type, team)";
}

TEST(GlooRendezvous, TwoBackendsOfOneTeamConnectIndependently) {
  if (comm().size() < 2) GTEST_SKIP() << "a team of one connects nothing";
  GlooBackend first(comm(), world()), second(comm(), world());
  for (GlooBackend* b : {&first, &second}) {
    Tensor t = tensorOf(contribution(41, b->rankInTeam(), 9, DataType::Int), DataType::Int);
    b->allreduce(t, ReduceOp::Sum)->wait(kWait);
    std::vector<std::vector<double>> all;
    for (int64_t r = 0; r < b->teamSize(); ++r) all.push_back(contribution(41, r, 9, DataType::Int));
    expectExact(t, reduceReference(all, ReduceOp::Sum, DataType::Int).value, "allreduce on a fresh backend");
  }
}

TEST(GlooRendezvous, ARankWithoutADeviceFailsEveryRankAtOnceNamingIt) {
  if (comm().size() < 2) GTEST_SKIP() << "needs a rank whose device works";
  const int64_t last = comm().size() - 1;
  std::optional<ScopedEnv> env;
  if (comm().rank() == last) env.emplace("MESHFUSE_GLOO_IFACE", "nosuchiface9");
  const auto start = std::chrono::steady_clock::now();
  const std::string msg = messageOf<std::runtime_error>([] { GlooBackend b(comm(), world()); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << "the others waited for it";
  EXPECT_NE(msg.find("rank " + std::to_string(last) + " "), std::string::npos) << msg;
  EXPECT_NE(msg.find("nosuchiface9"), std::string::npos) << msg;
  EXPECT_NE(msg.find(teamToString(world())), std::string::npos) << msg;
}

TEST(GlooWorkOrder, OperationsRunInPostingOrderWhileWaitsComeInAnyOrder) {
  Backend& gloo = worldGloo();
  const int64_t n = gloo.teamSize(), me = gloo.rankInTeam();
  constexpr int kOpsInFlight = 6;
  std::vector<Tensor> tensors;
  std::vector<std::unique_ptr<Work>> works;
  for (int i = 0; i < kOpsInFlight; ++i) {
    tensors.push_back(tensorOf(contribution(500 + i, me, 33 + i, DataType::Double), DataType::Double));
    works.push_back(gloo.allreduce(tensors.back(), i % 2 ? ReduceOp::Max : ReduceOp::Sum));
  }
  Tensor gathered = Tensor::zeros({n * 5}, DataType::Int32);
  works.push_back(gloo.allgather(tensorOf(contribution(600, me, 5, DataType::Int32), DataType::Int32), gathered));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait(kWait);  // newest first

  for (int i = 0; i < kOpsInFlight; ++i) {
    std::vector<std::vector<double>> all;
    for (int64_t r = 0; r < n; ++r) all.push_back(contribution(500 + i, r, 33 + i, DataType::Double));
    Reduced ref = reduceReference(all, i % 2 ? ReduceOp::Max : ReduceOp::Sum, DataType::Double);
    expectValues(tensors[i], ref.value, ref.tolerance, "allreduce " + std::to_string(i) + " of a batch");
  }
  std::vector<std::vector<double>> blocks;
  for (int64_t r = 0; r < n; ++r) blocks.push_back(contribution(600, r, 5, DataType::Int32));
  expectExact(gathered, concat(blocks), "allgather after the batch");
}

TEST(GlooPointToPoint, AReceivePostedBeforeACollectiveDoesNotHoldItUp) {
  Backend& gloo = worldGloo();
  if (gloo.teamSize() < 2) GTEST_SKIP() << "needs two ranks";
  const int64_t me = gloo.rankInTeam();
  // Rank 0 receives what rank 1 sends only after a collective both take part in: a receive that
  // waited on the collective worker would deadlock here.
  Tensor in = Tensor::zeros({21}, DataType::Float);
  std::unique_ptr<Work> receiving = me == 0 ? gloo.recv(in, 1) : nullptr;
  Tensor t = tensorOf(contribution(700, me, 8, DataType::Float), DataType::Float);
  gloo.allreduce(t, ReduceOp::Min)->wait(kWait);
  Tensor message = tensorOf(contribution(701, 1, 21, DataType::Float), DataType::Float);
  if (me == 1) gloo.send(message, 0)->wait(kWait);
  if (receiving) {
    receiving->wait(kWait);
    expectExact(in, contribution(701, 1, 21, DataType::Float), "recv posted before the allreduce");
  }
}

TEST(GlooPointToPoint, MessagesBetweenTwoRanksMatchInPostingOrder) {
  Backend& gloo = worldGloo();
  if (gloo.teamSize() < 2) GTEST_SKIP() << "needs two ranks";
  const int64_t me = gloo.rankInTeam();
  constexpr int kMessages = 4;
  std::vector<Tensor> received;
  std::vector<std::unique_ptr<Work>> works;
  for (int i = 0; i < kMessages; ++i) {
    if (me == 0) works.push_back(gloo.send(tensorOf(contribution(800 + i, 0, 12, DataType::Int), DataType::Int), 1));
    if (me == 1) works.push_back(gloo.recv(received.emplace_back(Tensor::zeros({12}, DataType::Int)), 0));
  }
  for (auto& w : works) w->wait(kWait);
  for (int i = 0; i < static_cast<int>(received.size()); ++i)
    expectExact(received[i], contribution(800 + i, 0, 12, DataType::Int), "message " + std::to_string(i));
}

TEST(GlooPointToPoint, MessagesToOneselfEitherWayRound) {
  Backend& gloo = worldGloo();
  const int64_t me = gloo.rankInTeam();
  const auto a = contribution(900, me, 10, DataType::BFloat16), b = contribution(901, me, 10, DataType::BFloat16);
  // Send first (buffered, so the sender may overwrite its tensor at once), then receive.
  Tensor sent = tensorOf(a, DataType::BFloat16);
  gloo.send(sent, me)->wait(kWait);
  sent.copyFrom(tensorOf(b, DataType::BFloat16));
  Tensor first = Tensor::zeros({10}, DataType::BFloat16);
  gloo.recv(first, me)->wait(kWait);
  expectExact(first, a, "send to self, then recv");
  // Receive first: completes when the send comes.
  Tensor second = Tensor::zeros({2, 5}, DataType::BFloat16);
  auto receiving = gloo.recv(second, me);
  EXPECT_FALSE(receiving->test());
  gloo.send(sent, me)->wait(kWait);
  receiving->wait(kWait);
  expectExact(second, b, "recv from self, then send");
  // A message of another size is an error of the receive, naming both.
  Tensor wrong = Tensor::zeros({3}, DataType::BFloat16);
  auto mismatched = gloo.recv(wrong, me);
  gloo.send(sent, me)->wait(kWait);
  const std::string msg = messageOf<std::runtime_error>([&] { mismatched->wait(kWait); });
  EXPECT_NE(msg.find("gloo recv from team rank " + std::to_string(me)), std::string::npos) << msg;
  EXPECT_NE(msg.find("BFloat16[10]"), std::string::npos) << msg;
}

TEST(GlooTimeout, ACollectiveTheOthersSkipTimesOutThenGlooGivesUp) {
  if (comm().size() < 2) GTEST_SKIP() << "needs a peer that does not come";
  // A backend of its own: after a Gloo timeout its pairs are closed.
  GlooBackend gloo(comm(), world(), std::chrono::milliseconds(1500));
  if (gloo.rankInTeam() == 0) {
    Tensor t = Tensor::zeros({64}, DataType::Float);
    auto work = gloo.allreduce(t, ReduceOp::Sum);  // nobody else takes part
    const auto start = std::chrono::steady_clock::now();
    const std::string msg = messageOf<CommunicationTimeout>([&] { work->wait(std::chrono::milliseconds(200)); });
    const auto waited = std::chrono::steady_clock::now() - start;
    EXPECT_GE(waited, std::chrono::milliseconds(200));
    EXPECT_LT(waited, std::chrono::seconds(5));
    EXPECT_NE(msg.find("gloo allreduce(sum)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("on team " + teamToString(world())), std::string::npos) << msg;
    EXPECT_NE(msg.find("timeout 200 ms"), std::string::npos) << msg;
    EXPECT_FALSE(work->test());
    // The worker is not stuck for good: Gloo's operation timeout ends the allreduce.
    const std::string gave_up = messageOf<CommunicationTimeout>([&] { work->wait(kWait); });
    EXPECT_NE(gave_up.find("gloo gave up waiting"), std::string::npos) << gave_up;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  }
  comm().barrier();  // the peers keep their end open until rank 0 is done
}

TEST(GlooTimeout, AReceiveNobodySendsTimesOutNamingIt) {
  if (comm().size() < 2) GTEST_SKIP() << "needs a peer that does not send";
  GlooBackend gloo(comm(), world(), std::chrono::milliseconds(1500));
  if (gloo.rankInTeam() == 0) {
    Tensor lost = Tensor::zeros({16}, DataType::Int32);
    auto work = gloo.recv(lost, 1);
    const std::string msg = messageOf<CommunicationTimeout>([&] { work->wait(std::chrono::milliseconds(100)); });
    EXPECT_NE(msg.find("gloo recv from team rank 1 (Int32[16]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("waited"), std::string::npos) << msg;
    const std::string gave_up = messageOf<CommunicationTimeout>([&] { work->wait(kWait); });
    EXPECT_NE(gave_up.find("gloo gave up waiting"), std::string::npos) << gave_up;
  }
  comm().barrier();
}

TEST(GlooValidation, BadArgumentsThrowOnEveryRankBeforeAnyCommunication) {
  // Only arguments every rank checks (a root's output is checked on the root alone).
  Backend& gloo = worldGloo();
  const int64_t n = gloo.teamSize();
  Tensor block = Tensor::zeros({4}, DataType::Float);
  Tensor too_small = Tensor::zeros({4 * n - 1}, DataType::Float);
  Tensor doubles = Tensor::zeros({4 * n}, DataType::Double);
  std::string msg = messageOf<std::invalid_argument>([&] { gloo.allgather(block, too_small); });
  EXPECT_NE(msg.find("gloo allgather: output has " + std::to_string(4 * n - 1) + " elements, expected " +
                     std::to_string(4 * n)),
            std::string::npos)
      << msg;
  msg = messageOf<std::invalid_argument>([&] { gloo.allgather(block, doubles); });
  EXPECT_NE(msg.find("the gloo backend does not convert"), std::string::npos) << msg;
  msg = messageOf<std::invalid_argument>([&] { gloo.broadcast(block, n); });
  EXPECT_NE(msg.find("gloo broadcast: root " + std::to_string(n) + " is not a team rank"), std::string::npos) << msg;
  msg = messageOf<std::invalid_argument>([&] { gloo.send(block, -1); });
  EXPECT_NE(msg.find("gloo send: peer -1"), std::string::npos) << msg;
  Tensor strided = Tensor::zeros({4, 2}, DataType::Float).permute({1, 0});
  msg = messageOf<std::invalid_argument>([&] { gloo.allreduce(strided, ReduceOp::Sum); });
  EXPECT_NE(msg.find("is not contiguous"), std::string::npos) << msg;
  if (n > 1) {
    Tensor odd = Tensor::zeros({n * 3 + 1}, DataType::Float);
    msg = messageOf<std::invalid_argument>([&] { gloo.allToAll(odd, odd); });
    EXPECT_NE(msg.find("not divisible by the team size"), std::string::npos) << msg;
  }
  // Nobody was left inside a collective: the next one works.
  Tensor t = tensorOf(contribution(1000, gloo.rankInTeam(), 6, DataType::Int), DataType::Int);
  gloo.allreduce(t, ReduceOp::Max)->wait(kWait);
  std::vector<std::vector<double>> all;
  for (int64_t r = 0; r < n; ++r) all.push_back(contribution(1000, r, 6, DataType::Int));
  expectExact(t, reduceReference(all, ReduceOp::Max, DataType::Int).value, "allreduce after rejected calls");
}

TEST(GlooLarge, TensorsOfManyGlooSegments) {
  // Gloo moves at most 1 MiB a segment: these span several, with a ragged end.
  Backend& gloo = worldGloo();
  const int64_t n = gloo.teamSize(), me = gloo.rankInTeam();
  const int64_t numel = (int64_t{1} << 20) + 7;
  std::vector<std::vector<double>> all;
  for (int64_t r = 0; r < n; ++r) all.push_back(contribution(1100, r, numel, DataType::Float));
  Tensor t = tensorOf(all[me], DataType::Float);
  gloo.allreduce(t, ReduceOp::Sum)->wait(kWait);
  Reduced ref = reduceReference(all, ReduceOp::Sum, DataType::Float);
  expectValues(t, ref.value, ref.tolerance, "allreduce of 4 MiB");

  const int64_t block = (int64_t{1} << 19) + 3;
  std::vector<std::vector<double>> inputs, mine;
  for (int64_t r = 0; r < n; ++r) {
    inputs.push_back(contribution(1101, r, n * block, DataType::Half));
    mine.push_back(slice(inputs.back(), me * block, block));
  }
  Tensor out = Tensor::zeros({block}, DataType::Half);
  gloo.reduceScatter(tensorOf(inputs[me], DataType::Half), out, ReduceOp::Sum)->wait(kWait);
  Reduced rs = reduceReference(mine, ReduceOp::Sum, DataType::Half);
  expectValues(out, rs.value, rs.tolerance, "reduceScatter of 1 MiB blocks");

  const int64_t root = n - 1;
  Tensor b = me == root ? tensorOf(all[root], DataType::Float) : Tensor::zeros({numel}, DataType::Float);
  gloo.broadcast(b, root)->wait(kWait);
  expectExact(b, all[root], "broadcast of 4 MiB from the last rank");
}

}  // namespace
}  // namespace meshfuse

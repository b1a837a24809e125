// The host backends' collectives (MPI, and Gloo and UCC where they are built), every operation x every dtype
// x three teams (the world, the world in reverse order, and the ranks of my parity: two sub-teams
// running at once, or teams of one with 2 ranks). Every rank's contribution comes from a generator
// seeded by (test, team rank), so each rank recomputes all contributions and checks its result
// against a float64 reference (helpers in backend_test_utils.h).
#include <gtest/gtest.h>

#include "backend_test_utils.h"
#include "mp_test_utils.h"

namespace meshfuse {
namespace {

using namespace meshfuse::testing;

using Param = std::tuple<CommunicatorBackend, DataType, TeamKind>;

class BackendCollectives : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    dtype_ = std::get<1>(GetParam());
    team_ = teamOf(std::get<2>(GetParam()));
    backend_ = &Communicator::instance().backend(std::get<0>(GetParam()), team_);
    n_ = backend_->teamSize();
    me_ = backend_->rankInTeam();
    // Different data for every (test, dtype, team kind); the same on every rank.
    seed_ = std::hash<std::string>{}(::testing::UnitTest::GetInstance()->current_test_info()->name()) % 100000;
  }
  // Every team rank's contribution for this test.
  std::vector<std::vector<double>> everyone(uint64_t seed, int64_t numel, ReduceOp op = ReduceOp::Sum) const {
    std::vector<std::vector<double>> all;
    for (int64_t r = 0; r < n_; ++r) all.push_back(contribution(seed, r, numel, dtype_, op));
    return all;
  }
  std::string where(const std::string& op) const {
    return toString(backend_->type()) + " " + op + " " + toString(dtype_) + " on team " + teamToString(team_) +
           " at team rank " + std::to_string(me_);
  }

  DataType dtype_ = DataType::Float;
  std::vector<int64_t> team_;
  Backend* backend_ = nullptr;
  int64_t n_ = 1, me_ = 0;
  uint64_t seed_ = 0;
};

TEST_P(BackendCollectives, Allgather) {
  const int64_t block = 37;
  auto all = everyone(seed_, block);
  Tensor input = tensorOf(all[me_], dtype_);
  Tensor output = Tensor::zeros({n_ * block}, dtype_);
  backend_->allgather(input, output)->wait(kWait);
  expectExact(output, concat(all), where("allgather"));
}

TEST_P(BackendCollectives, AllgatherInPlace) {
  const int64_t block = 19;
  auto all = everyone(seed_, block);
  Tensor output = Tensor::zeros({n_ * block}, dtype_);
  Tensor mine = output.slice(0, me_ * block, block);  // the input is my block of the output
  mine.copyFrom(tensorOf(all[me_], dtype_));
  backend_->allgather(mine, output)->wait(kWait);
  expectExact(output, concat(all), where("allgather in place"));
}

TEST_P(BackendCollectives, Allreduce) {
  for (ReduceOp op : kOps) {
    auto all = everyone(seed_ + static_cast<uint64_t>(op), 53, op);
    Tensor t = tensorOf(all[me_], dtype_);
    backend_->allreduce(t, op)->wait(kWait);
    Reduced ref = reduceReference(all, op, dtype_);
    expectValues(t, ref.value, ref.tolerance, where("allreduce " + toString(op)));
  }
}

TEST_P(BackendCollectives, ReduceScatter) {
  const int64_t block = 29;
  for (ReduceOp op : kOps) {
    auto all = everyone(seed_ + static_cast<uint64_t>(op), n_ * block, op);
    Tensor input = tensorOf(all[me_], dtype_);
    Tensor output = Tensor::zeros({block}, dtype_);
    backend_->reduceScatter(input, output, op)->wait(kWait);
    std::vector<std::vector<double>> my_blocks;
    for (const auto& part : all) my_blocks.push_back(slice(part, me_ * block, block));
    Reduced ref = reduceReference(my_blocks, op, dtype_);
    expectValues(output, ref.value, ref.tolerance, where("reduceScatter " + toString(op)));
  }
}

TEST_P(BackendCollectives, ReduceToEveryRoot) {
  for (int64_t root = 0; root < n_; ++root)
    for (ReduceOp op : kOps) {
      auto all = everyone(seed_ + 10 * static_cast<uint64_t>(root) + static_cast<uint64_t>(op), 41, op);
      Tensor input = tensorOf(all[me_], dtype_);
      Tensor output = me_ == root ? Tensor::zeros({41}, dtype_) : Tensor();  // only the root has one
      backend_->reduce(input, output, root, op)->wait(kWait);
      expectExact(input, all[me_], where("reduce leaves its input alone"));
      if (me_ != root) continue;
      Reduced ref = reduceReference(all, op, dtype_);
      expectValues(output, ref.value, ref.tolerance, where("reduce " + toString(op) + " root " + std::to_string(root)));
    }
}

TEST_P(BackendCollectives, BroadcastFromEveryRoot) {
  for (int64_t root = 0; root < n_; ++root) {
    auto all = everyone(seed_ + static_cast<uint64_t>(root), 31);
    Tensor t = me_ == root ? tensorOf(all[root], dtype_) : Tensor::zeros({31}, dtype_);
    backend_->broadcast(t, root)->wait(kWait);
    expectExact(t, all[root], where("broadcast root " + std::to_string(root)));
  }
}

TEST_P(BackendCollectives, GatherToEveryRoot) {
  const int64_t block = 23;
  for (int64_t root = 0; root < n_; ++root) {
    auto all = everyone(seed_ + static_cast<uint64_t>(root), block);
    Tensor input = tensorOf(all[me_], dtype_);
    Tensor output = me_ == root ? Tensor::zeros({n_ * block}, dtype_) : Tensor();
    backend_->gather(input, output, root)->wait(kWait);
    if (me_ == root) expectExact(output, concat(all), where("gather root " + std::to_string(root)));
  }
}

TEST_P(BackendCollectives, ScatterFromEveryRoot) {
  const int64_t block = 17;
  for (int64_t root = 0; root < n_; ++root) {
    auto full = contribution(seed_ + static_cast<uint64_t>(root), root, n_ * block, dtype_);
    Tensor input = me_ == root ? tensorOf(full, dtype_) : Tensor();  // only the root has one
    Tensor output = Tensor::zeros({block}, dtype_);
    backend_->scatter(input, output, root)->wait(kWait);
    expectExact(output, slice(full, me_ * block, block), where("scatter root " + std::to_string(root)));
  }
}

TEST_P(BackendCollectives, AllToAll) {
  const int64_t block = 13;
  auto all = everyone(seed_, n_ * block);
  Tensor input = tensorOf(all[me_], dtype_);
  Tensor output = Tensor::zeros({n_ * block}, dtype_);
  backend_->allToAll(input, output)->wait(kWait);
  std::vector<std::vector<double>> expected;  // block i: what team rank i sent to me
  for (int64_t i = 0; i < n_; ++i) expected.push_back(slice(all[i], me_ * block, block));
  expectExact(output, concat(expected), where("allToAll"));
}

TEST_P(BackendCollectives, SendRecvAroundTheRing) {
  auto all = everyone(seed_, 47);
  const int64_t next = (me_ + 1) % n_, prev = (me_ + n_ - 1) % n_;
  Tensor out = tensorOf(all[me_], dtype_);
  Tensor in = Tensor::zeros({47}, dtype_);
  auto receiving = backend_->recv(in, prev);  // posted first: a team of one sends to itself
  auto sending = backend_->send(out, next);
  receiving->wait(kWait);
  sending->wait(kWait);
  expectExact(in, all[prev], where("recv from team rank " + std::to_string(prev)));
}

TEST_P(BackendCollectives, TestReportsCompletion) {
  Tensor t = tensorOf(contribution(seed_, me_, 8, dtype_), dtype_);
  auto work = backend_->allreduce(t, ReduceOp::Max);
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (!work->test()) ASSERT_LT(std::chrono::steady_clock::now(), deadline) << where("test() never became true");
  EXPECT_TRUE(work->test());
  work->wait(kWait);  // a finished Work waits for nothing
  Reduced ref = reduceReference(everyone(seed_, 8), ReduceOp::Max, dtype_);
  expectExact(t, ref.value, where("allreduce max polled with test()"));
}

std::string paramName(const ::testing::TestParamInfo<Param>& info) {
  static const char* kTeams[] = {"world", "reversed", "parity"};
  return toString(std::get<0>(info.param)) + "_" + toString(std::get<1>(info.param)) + "_" +
         kTeams[static_cast<int>(std::get<2>(info.param))];
}

INSTANTIATE_TEST_SUITE_P(EveryBackendDtypeAndTeam, BackendCollectives,
                         ::testing::Combine(::testing::ValuesIn(hostBackends()),
                                            ::testing::Values(DataType::Float, DataType::Double, DataType::Half,
                                                              DataType::BFloat16, DataType::Int, DataType::Int32,
                                                              DataType::Bool),
                                            ::testing::Values(TeamKind::World, TeamKind::Reversed, TeamKind::Parity)),
                         paramName);

}  // namespace
}  // namespace meshfuse

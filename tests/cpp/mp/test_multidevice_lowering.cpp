// Every communication type DESIGN.md's table lowers to, run end to end through
// FusionExecutorCache on every rank and checked against the global data, which every rank
// generates identically from a seed.
#include <gtest/gtest.h>

#include "host_ir/fusion_executor.h"
#include "mp_test_utils.h"
#include "multidevice/communicator.h"
#include "ops/ops.h"

namespace meshfuse {
namespace {

using testing::expectClose;
using testing::linearReference;
using testing::randomTensor;
using testing::shardOf;

class MultiDevice : public ::testing::Test {
 protected:
  Communicator& comm = Communicator::instance();
  int64_t rank = comm.rank();
  int64_t n = comm.size();
  DeviceMesh world() const { return testing::worldMesh(); }
  static void shard(TensorView* tv, int axis, const DeviceMesh& mesh, ParallelType p = ParallelType::MeshX) {
    tv->setDeviceMesh(mesh);
    int loop_axis = 0;
    for (int i = 0; i < static_cast<int>(tv->loop().size()); ++i)
      if (tv->loop()[i].logical == axis) loop_axis = i;
    tv->outerSplit(loop_axis, mesh.size(p));
    tv->parallelize(loop_axis, p);
  }
  std::vector<Tensor> run(std::shared_ptr<Fusion> f, const std::vector<Argument>& in, std::string* host_ir = nullptr) {
    FusionExecutorCache fec(std::move(f));
    auto out = fec.execute(in);
    if (host_ir) *host_ir = fec.lastHostIr();
    return out;
  }
};

TEST_F(MultiDevice, AllgatherAlongEachAxis) {
  for (int axis : {0, 1}) {
    auto f = std::make_shared<Fusion>();
    TensorView* x = f->newTensor(DataType::Float, {2 * n, 3 * n});
    f->addInput(x);
    TensorView* y = ops::set(x);
    f->addOutput(y);
    shard(x, axis, world());
    y->setDeviceMesh(world());
    Tensor full = randomTensor({2 * n, 3 * n}, 11 + axis);
    std::string hir;
    auto out = run(f, {shardOf(full, axis, n, rank)}, &hir);
    expectClose(out[0], full, 0, "allgather axis " + std::to_string(axis));
    EXPECT_NE(hir.find("Allgather"), std::string::npos) << hir;
  }
}

TEST_F(MultiDevice, SumOverShardedAxisIsAllreduce) {
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Double, {5, 4 * n});
  f->addInput(x);
  TensorView* s = ops::reduction(OpType::Sum, x, {1}, false);
  f->addOutput(s);
  shard(x, 1, world());
  s->setDeviceMesh(world());
  Tensor full = randomTensor({5, 4 * n}, 21, DataType::Double);
  std::string hir;
  auto out = run(f, {shardOf(full, 1, n, rank)}, &hir);
  Tensor expected = Tensor::zeros({5}, DataType::Double);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 4 * n; ++j) expected.dataAs<double>()[i] += full.item(i * 4 * n + j);
  expectClose(out[0], expected, 1e-12, "sum over sharded axis");
  EXPECT_NE(hir.find("Allreduce"), std::string::npos) << hir;
}

TEST_F(MultiDevice, RowParallelLinearToShardedOutputIsReduceScatter) {
  const int64_t m = 2 * n, k = 4 * n, nn = 6;
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {m, k});
  TensorView* w = f->newTensor(DataType::Float, {nn, k});
  f->addInput(x);
  f->addInput(w);
  TensorView* y = ops::linear(x, w);
  f->addOutput(y);
  shard(x, 1, world());
  shard(w, 1, world());
  shard(y, 0, world());
  Tensor xf = randomTensor({m, k}, 31), wf = randomTensor({nn, k}, 32);
  std::string hir;
  auto out = run(f, {shardOf(xf, 1, n, rank), shardOf(wf, 1, n, rank)}, &hir);
  expectClose(out[0], shardOf(linearReference(xf, wf), 0, n, rank), 1e-4, "reduce-scatter");
  EXPECT_NE(hir.find("ReduceScatter"), std::string::npos) << hir;
}

TEST_F(MultiDevice, ReduceAndGatherOntoOneDevice) {
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {3 * n, 4});
  f->addInput(x);
  TensorView* s = ops::reduction(OpType::Sum, x, {0}, false);
  TensorView* g = ops::set(x);
  f->addOutput(s);
  f->addOutput(g);
  shard(x, 0, world());
  int64_t root = n - 1;
  s->setDeviceMesh(DeviceMesh({root}));
  g->setDeviceMesh(DeviceMesh({root}));
  Tensor full = randomTensor({3 * n, 4}, 41);
  std::string hir;
  auto out = run(f, {shardOf(full, 0, n, rank)}, &hir);
  EXPECT_NE(hir.find("Reduce("), std::string::npos) << hir;
  EXPECT_NE(hir.find("Gather("), std::string::npos) << hir;
  if (rank != root) {
    EXPECT_FALSE(out[0].defined());
    EXPECT_FALSE(out[1].defined());
    return;
  }
  Tensor expected = Tensor::zeros({4}, DataType::Double);
  for (int64_t i = 0; i < 3 * n; ++i)
    for (int64_t j = 0; j < 4; ++j) expected.dataAs<double>()[j] += full.item(i * 4 + j);
  expectClose(out[0], expected, 1e-5, "reduce");
  expectClose(out[1], full, 0, "gather");
}

TEST_F(MultiDevice, BroadcastAndScatterFromOneDevice) {
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Int, {2 * n, 3});
  f->addInput(x);
  TensorView* b = ops::set(x);
  TensorView* s = ops::set(x);
  f->addOutput(b);
  f->addOutput(s);
  x->setDeviceMesh(DeviceMesh({0}));
  b->setDeviceMesh(world());
  shard(s, 0, world());
  Tensor full = randomTensor({2 * n, 3}, 51).to(DataType::Double);
  for (int64_t i = 0; i < full.numel(); ++i) full.dataAs<double>()[i] = std::round(full.dataAs<double>()[i] * 100);
  Tensor full_int = full.to(DataType::Int);
  std::string hir;
  auto out = run(f, {rank == 0 ? Argument(full_int) : Argument()}, &hir);
  expectClose(out[0], full, 0, "broadcast");
  expectClose(out[1], shardOf(full, 0, n, rank), 0, "scatter");
  EXPECT_NE(hir.find("Broadcast"), std::string::npos) << hir;
  EXPECT_NE(hir.find("Scatter"), std::string::npos) << hir;
}

TEST_F(MultiDevice, ReshardBetweenAxesIsAllToAll) {
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {2 * n, 3 * n, 2});
  f->addInput(x);
  TensorView* y = ops::set(x);
  f->addOutput(y);
  shard(x, 0, world());
  shard(y, 1, world());
  Tensor full = randomTensor({2 * n, 3 * n, 2}, 61);
  std::string hir;
  auto out = run(f, {shardOf(full, 0, n, rank)}, &hir);
  expectClose(out[0], shardOf(full, 1, n, rank), 0, "all-to-all");
  EXPECT_NE(hir.find("AllToAll"), std::string::npos) << hir;
}

TEST_F(MultiDevice, PipelineStagesOnTwoMeshesUseSendRecv) {
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  std::vector<int64_t> first, second;
  for (int64_t i = 0; i < n; ++i) (i < n / 2 ? first : second).push_back(i);
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {n, 5});
  f->addInput(x);
  TensorView* h = ops::unary(OpType::Relu, x);                                       // stage 1
  TensorView* y = ops::binary(OpType::Mul, h, f->newScalar(DataType::Double, 3.0));  // stage 2
  f->addOutput(y);
  shard(x, 0, DeviceMesh(first));
  shard(h, 0, DeviceMesh(first));
  shard(y, 0, DeviceMesh(second));
  Tensor full = randomTensor({n, 5}, 71);
  Tensor expected = Tensor::empty({n, 5}, DataType::Double);
  for (int64_t i = 0; i < full.numel(); ++i) expected.dataAs<double>()[i] = 3.0 * std::max(0.0, full.item(i));
  bool in_first = rank < n / 2;
  std::string hir;
  auto out = run(f, {in_first ? Argument(shardOf(full, 0, n / 2, rank)) : Argument()}, &hir);
  EXPECT_NE(hir.find("SendRecv"), std::string::npos) << hir;
  if (in_first)
    EXPECT_FALSE(out[0].defined());
  else
    expectClose(out[0], shardOf(expected, 0, n / 2, rank - n / 2), 1e-6, "pipeline");
}

TEST_F(MultiDevice, ColumnThenRowParallelMlp) {
  const int64_t m = 4, k = 8, hdim = 4 * n;
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {m, k});
  TensorView* w1 = f->newTensor(DataType::Float, {hdim, k});
  TensorView* b1 = f->newTensor(DataType::Float, {hdim});
  TensorView* w2 = f->newTensor(DataType::Float, {k, hdim});
  TensorView* b2 = f->newTensor(DataType::Float, {k});
  for (TensorView* t : {x, w1, b1, w2, b2}) f->addInput(t);
  TensorView* h = ops::unary(OpType::Relu, ops::linear(x, w1, b1));
  TensorView* y = ops::linear(h, w2, b2);
  f->addOutput(y);
  x->setDeviceMesh(world());
  shard(w1, 0, world());
  shard(b1, 0, world());
  shard(w2, 1, world());
  b2->setDeviceMesh(world());
  y->setDeviceMesh(world());
  Tensor xf = randomTensor({m, k}, 81), w1f = randomTensor({hdim, k}, 82), b1f = randomTensor({hdim}, 83),
         w2f = randomTensor({k, hdim}, 84), b2f = randomTensor({k}, 85);
  std::string hir;
  auto out = run(f, {xf, shardOf(w1f, 0, n, rank), shardOf(b1f, 0, n, rank), shardOf(w2f, 1, n, rank), b2f}, &hir);
  Tensor hr = linearReference(xf, w1f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < hdim; ++j) {
      double& v = hr.dataAs<double>()[i * hdim + j];
      v = std::max(0.0, v + b1f.item(j));
    }
  Tensor yr = linearReference(hr, w2f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < k; ++j) yr.dataAs<double>()[i * k + j] += b2f.item(j);
  expectClose(out[0], yr, 1e-4, "tensor-parallel MLP");
  EXPECT_NE(hir.find("Allreduce"), std::string::npos) << hir;
}

TEST_F(MultiDevice, SequenceParallelLinear) {
  const int64_t s = 2 * n, k = 6, nn = 2 * n;
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {s, k});
  TensorView* w = f->newTensor(DataType::Float, {nn, k});
  TensorView* w2 = f->newTensor(DataType::Float, {k, nn});
  f->addInput(x);
  f->addInput(w);
  f->addInput(w2);
  TensorView* h = ops::linear(x, w);   // allgather x along the sequence, column-parallel w
  TensorView* y = ops::linear(h, w2);  // row-parallel w2, reduce-scatter along the sequence
  f->addOutput(y);
  shard(x, 0, world());
  shard(w, 0, world());
  shard(h, 1, world());
  shard(w2, 1, world());
  shard(y, 0, world());
  Tensor xf = randomTensor({s, k}, 91), wf = randomTensor({nn, k}, 92), w2f = randomTensor({k, nn}, 93);
  std::string hir;
  auto out = run(f, {shardOf(xf, 0, n, rank), shardOf(wf, 0, n, rank), shardOf(w2f, 1, n, rank)}, &hir);
  Tensor expected = linearReference(linearReference(xf, wf), w2f);
  expectClose(out[0], shardOf(expected, 0, n, rank), 1e-4, "sequence parallel");
  EXPECT_NE(hir.find("Allgather"), std::string::npos) << hir;
  EXPECT_NE(hir.find("ReduceScatter"), std::string::npos) << hir;
}

TEST_F(MultiDevice, DataTimesTensorParallelOnTwoDimensionalMesh) {
  if (n != 4) GTEST_SKIP() << "needs 4 ranks for a 2x2 mesh";
  DeviceMesh mesh({0, 1, 2, 3}, {2, 2});  // mesh_y = data parallel, mesh_x = tensor parallel
  const int64_t b = 4, k = 6, hdim = 8;
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {b, k});
  TensorView* w1 = f->newTensor(DataType::Float, {hdim, k});
  TensorView* w2 = f->newTensor(DataType::Float, {k, hdim});
  for (TensorView* t : {x, w1, w2}) f->addInput(t);
  TensorView* y = ops::linear(ops::linear(x, w1), w2);
  f->addOutput(y);
  shard(x, 0, mesh, ParallelType::MeshY);
  shard(w1, 0, mesh, ParallelType::MeshX);
  shard(w2, 1, mesh, ParallelType::MeshX);
  shard(y, 0, mesh, ParallelType::MeshY);
  Tensor xf = randomTensor({b, k}, 101), w1f = randomTensor({hdim, k}, 102), w2f = randomTensor({k, hdim}, 103);
  int64_t dp = mesh.coordinate(rank, ParallelType::MeshY), tp = mesh.coordinate(rank, ParallelType::MeshX);
  std::string hir;
  auto out = run(f, {shardOf(xf, 0, 2, dp), shardOf(w1f, 0, 2, tp), shardOf(w2f, 1, 2, tp)}, &hir);
  Tensor expected = linearReference(linearReference(xf, w1f), w2f);
  expectClose(out[0], shardOf(expected, 0, 2, dp), 1e-4, "2-D mesh");
  EXPECT_NE(hir.find("Allreduce"), std::string::npos) << hir;
}

TEST_F(MultiDevice, BadInputOnOneRankFailsEveryRankNamingIt) {
  if (n < 2) GTEST_SKIP();
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {2 * n, 4});
  f->addInput(x);
  TensorView* y = ops::set(x);
  f->addOutput(y);
  shard(x, 0, world());
  y->setDeviceMesh(world());
  const int64_t bad = n - 1;
  Tensor local = randomTensor({rank == bad ? int64_t{3} : int64_t{2}, 4}, 111);
  FusionExecutorCache fec(f);
  try {
    fec.execute({local});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    std::string msg = e.what();
    if (rank == bad)
      EXPECT_NE(msg.find("T0 (input 0) axis 0"), std::string::npos) << msg;
    else
      EXPECT_NE(msg.find("rank " + std::to_string(bad)), std::string::npos) << msg;
  }
  // Afterwards the same cache still works with good input on every rank.
  Tensor full = randomTensor({2 * n, 4}, 112);
  auto out = fec.execute({shardOf(full, 0, n, rank)});
  expectClose(out[0], full, 0, "after a failed execute");
}

// An input parallelized on mesh_x with no mesh set: every rank says so (a 2-rank run read the absent
// mesh's device count for its extent message: "split over 93919640698096 devices").
TEST_F(MultiDevice, AShardedInputWithoutAMeshIsNamedOnEveryRank) {
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {2 * n, 4});
  f->addInput(x);
  f->addOutput(ops::unary(OpType::Neg, x));
  x->outerSplit(0, n);
  x->parallelize(0, ParallelType::MeshX);
  try {
    FusionExecutorCache(f).execute({randomTensor({2, 4}, 113)});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("T0 is parallelized on a mesh dimension but has no device mesh"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshfuse

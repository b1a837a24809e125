// ParallelType::stream: allgather + linear and linear + reduce-scatter pipelined over s chunks
// give the same results as without chunking, for s in {1, 2, 4, 8}; a chunk count that does not
// divide the rows is a clear error.
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

class StreamOverlap : public ::testing::TestWithParam<int64_t> {
 protected:
  Communicator& comm = Communicator::instance();
  int64_t rank = comm.rank();
  int64_t n = comm.size();
  DeviceMesh world() const { return testing::worldMesh(); }
  // Shards logical `axis` (a whole loop axis at loop position `loop_axis`) over the world.
  void shard(TensorView* tv, int64_t loop_axis) {
    tv->setDeviceMesh(world());
    tv->outerSplit(loop_axis, n);
    tv->parallelize(loop_axis, ParallelType::MeshX);
  }
};

TEST_P(StreamOverlap, AllgatherThenLinear) {
  const int64_t s = GetParam(), rows = 8 * n, k = 12, cols = 4 * n;
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {rows, k});
  TensorView* w = f->newTensor(DataType::Float, {cols, k});
  TensorView* b = f->newTensor(DataType::Float, {cols});
  f->addInput(x);
  f->addInput(w);
  f->addInput(b);
  TensorView* y = ops::linear(x, w, b);
  f->addOutput(y);
  shard(x, 0);
  shard(w, 0);
  shard(b, 0);
  y->setDeviceMesh(world());
  y->outerSplit(1, n);
  y->parallelize(1, ParallelType::MeshX);  // loop [i0, mesh_x:i1o, i1i]
  y->outerSplit(0, s);
  y->parallelize(0, ParallelType::Stream);  // loop [stream:i0o, i0i, mesh_x:i1o, i1i]
  Tensor xf = randomTensor({rows, k}, 201), wf = randomTensor({cols, k}, 202), bf = randomTensor({cols}, 203);
  FusionExecutorCache fec(f);
  MultiDeviceExecutorParams params;
  params.executor.number_of_streams = 2;
  auto out = fec.execute({shardOf(xf, 0, n, rank), shardOf(wf, 0, n, rank), shardOf(bf, 0, n, rank)}, params);
  Tensor expected = linearReference(xf, wf);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) expected.dataAs<double>()[i * cols + j] += bf.item(j);
  expectClose(out[0], shardOf(expected, 1, n, rank), 1e-4, "allgather+linear, s=" + std::to_string(s));
  EXPECT_NE(fec.lastHostIr().find("ForLoop"), std::string::npos) << fec.lastHostIr() << fec.lastLoweredFusion();
}

TEST_P(StreamOverlap, LinearThenReduceScatter) {
  const int64_t s = GetParam(), rows = 8 * n, k = 4 * n, cols = 10;
  auto f = std::make_shared<Fusion>();
  TensorView* h = f->newTensor(DataType::Float, {rows, k});
  TensorView* w = f->newTensor(DataType::Float, {cols, k});
  f->addInput(h);
  f->addInput(w);
  TensorView* y = ops::linear(h, w);
  f->addOutput(y);
  shard(h, 1);
  shard(w, 1);
  shard(y, 0);          // loop [mesh_x:i0o, i0i, i1]
  y->outerSplit(1, s);  // split the local rows: [mesh_x:i0o, i0io{s}, i0ii, i1]
  y->parallelize(1, ParallelType::Stream);
  Tensor hf = randomTensor({rows, k}, 211), wf = randomTensor({cols, k}, 212);
  FusionExecutorCache fec(f);
  auto out = fec.execute({shardOf(hf, 1, n, rank), shardOf(wf, 1, n, rank)});
  expectClose(out[0], shardOf(linearReference(hf, wf), 0, n, rank), 1e-4,
              "linear+reduce-scatter, s=" + std::to_string(s));
  EXPECT_NE(fec.lastHostIr().find("ForLoop"), std::string::npos) << fec.lastHostIr();
}

INSTANTIATE_TEST_SUITE_P(Chunks, StreamOverlap, ::testing::Values(1, 2, 4, 8));

TEST(StreamOverlapErrors, ChunkCountThatDoesNotDivideIsAClearError) {
  Communicator& comm = Communicator::instance();
  const int64_t n = comm.size();
  std::vector<int64_t> devices(n);
  for (int64_t i = 0; i < n; ++i) devices[i] = i;
  DeviceMesh mesh(devices);
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {6 * n, 4});
  TensorView* w = f->newTensor(DataType::Float, {2 * n, 4});
  f->addInput(x);
  f->addInput(w);
  TensorView* y = ops::linear(x, w);
  f->addOutput(y);
  for (TensorView* tv : {x, w}) {
    tv->setDeviceMesh(mesh);
    tv->outerSplit(0, n);
    tv->parallelize(0, ParallelType::MeshX);
  }
  y->setDeviceMesh(mesh);
  y->outerSplit(1, n);
  y->parallelize(1, ParallelType::MeshX);
  y->outerSplit(0, 4);  // 6 local rows do not split into 4 chunks
  y->parallelize(0, ParallelType::Stream);
  FusionExecutorCache fec(f);
  Tensor xs = randomTensor({6, 4}, 1), ws = randomTensor({2, 4}, 2);
  try {
    fec.execute({xs, ws});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshfuse

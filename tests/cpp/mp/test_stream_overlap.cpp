// ParallelType::stream: allgather + linear and linear + reduce-scatter pipelined over s chunks
// give the same results as without chunking, for s in {1, 2, 4, 8}; a chunk count that does not
// divide the rows is a clear error.
#include <gtest/gtest.h>

#include "host_ir/fusion_executor.h"
#include "mp_test_utils.h"
#include "multidevice/communicator.h"
#include "ops/ops.h"
#include "stream_overlap_fusions.h"

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
};

TEST_P(StreamOverlap, AllgatherThenLinear) {
  const int64_t s = GetParam(), rows = 8 * n, k = 12, cols = 4 * n;
  auto f = testing::allgatherLinearFusion(rows, k, cols, s, /*bias=*/true);
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
  auto f = testing::linearReduceScatterFusion(rows, k, cols, s);
  Tensor hf = randomTensor({rows, k}, 211), wf = randomTensor({cols, k}, 212);
  FusionExecutorCache fec(f);
  auto out = fec.execute({shardOf(hf, 1, n, rank), shardOf(wf, 1, n, rank)});
  expectClose(out[0], shardOf(linearReference(hf, wf), 0, n, rank), 1e-4,
              "linear+reduce-scatter, s=" + std::to_string(s));
  EXPECT_NE(fec.lastHostIr().find("ForLoop"), std::string::npos) << fec.lastHostIr();
}

INSTANTIATE_TEST_SUITE_P(Chunks, StreamOverlap, ::testing::Values(1, 2, 4, 8));

// At any rank count (docs/cluster.md runs this binary on 3 nodes): the 6 local rows do not split into
// 4 chunks; with an odd count the 6n global rows do not either, which the split itself reports.
TEST(StreamOverlapErrors, ChunkCountThatDoesNotDivideIsAClearError) {
  Communicator& comm = Communicator::instance();
  const int64_t n = comm.size();
  std::vector<int64_t> devices(n);
  for (int64_t i = 0; i < n; ++i) devices[i] = i;
  DeviceMesh mesh(devices);
  Tensor xs = randomTensor({6, 4}, 1), ws = randomTensor({2, 4}, 2);
  try {
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
    FusionExecutorCache(f).execute({xs, ws});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("does not divide") != std::string::npos ||
                what.find("does not split evenly by 4") != std::string::npos)
        << what;
  }
}

}  // namespace
}  // namespace meshfuse

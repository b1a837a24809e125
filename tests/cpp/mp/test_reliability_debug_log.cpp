// MESHFUSE_DEBUG=INFO on every rank: the newly lowered program and each posted communication
// (type, team, backend, bytes) are printed with that rank's prefix.
#include <gtest/gtest.h>

#include "host_ir/fusion_executor.h"
#include "mp_test_utils.h"
#include "multidevice/communicator.h"
#include "multidevice/debug_log.h"
#include "ops/ops.h"

namespace meshfuse {
namespace {

TEST(MultiDeviceDebugLog, InfoPrintsPostedCommunicationsWithRankTeamBackendAndBytes) {
  Communicator& comm = Communicator::instance();
  const int64_t n = comm.size(), rank = comm.rank();
  std::vector<int64_t> devices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) devices[static_cast<size_t>(i)] = i;
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {2 * n, 3});
  f->addInput(x);
  TensorView* y = ops::set(x);
  f->addOutput(y);
  x->setDeviceMesh(DeviceMesh(devices));
  x->outerSplit(0, n);
  x->parallelize(0, ParallelType::MeshX);
  y->setDeviceMesh(DeviceMesh(devices));
  FusionExecutorCache fec(f);
  Tensor full = testing::randomTensor({2 * n, 3}, 91);

  const debug::Level saved = debug::level();
  debug::setLevel(debug::Level::Info);
  ::testing::internal::CaptureStderr();
  auto out = fec.execute({testing::shardOf(full, 0, n, rank)});
  std::string log = ::testing::internal::GetCapturedStderr();
  debug::setLevel(saved);

  testing::expectClose(out[0], full, 0, "allgather with logging on");
  const std::string prefix = "[meshfuse rank " + std::to_string(rank) + "] ";
  EXPECT_NE(log.find(prefix + "lowered a new host program:"), std::string::npos) << log;
  EXPECT_NE(log.find(prefix + "post Allgather("), std::string::npos) << log;
  EXPECT_NE(log.find("team=" + shapeToString(devices)), std::string::npos) << log;
  EXPECT_NE(log.find("backend=mpi"), std::string::npos) << log;
  EXPECT_NE(log.find("in_bytes=24 out_bytes=" + std::to_string(24 * n)), std::string::npos) << log;
}

TEST(MultiDeviceDebugLog, InfoPrintsAStreamLoopsStreamCountAndEachChunksPost) {
  Communicator& comm = Communicator::instance();
  const int64_t n = comm.size(), rank = comm.rank();
  std::vector<int64_t> devices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) devices[static_cast<size_t>(i)] = i;
  const DeviceMesh mesh(devices);
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {4 * n, 3});
  TensorView* w = f->newTensor(DataType::Float, {2, 3});
  f->addInput(x);
  f->addInput(w);
  TensorView* y = ops::linear(x, w);  // x's row blocks allgathered chunk by chunk into the linear
  f->addOutput(y);
  for (TensorView* tv : {x, w, y}) tv->setDeviceMesh(mesh);
  x->outerSplit(0, n);
  x->parallelize(0, ParallelType::MeshX);
  y->outerSplit(0, 4);
  y->parallelize(0, ParallelType::Stream);
  FusionExecutorCache fec(f);
  MultiDeviceExecutorParams params;
  params.executor.number_of_streams = 2;

  const debug::Level saved = debug::level();
  debug::setLevel(debug::Level::Info);
  ::testing::internal::CaptureStderr();
  fec.execute({testing::shardOf(testing::randomTensor({4 * n, 3}, 92), 0, n, rank), testing::randomTensor({2, 3}, 93)},
              params);
  std::string log = ::testing::internal::GetCapturedStderr();
  debug::setLevel(saved);

  // The logged program is the one that runs: 2 streams (it said 1, the default, before the run set it).
  EXPECT_NE(log.find("ParallelType::stream over 2 streams"), std::string::npos) << log;
  // Each chunk's post with its own bytes: one row of 3 floats sent, n received.
  const std::string bytes = " in_bytes=12 out_bytes=" + std::to_string(12 * n) + "\n";
  for (int chunk = 0; chunk < 4; ++chunk) {
    const size_t at = log.find("post chunk " + std::to_string(chunk) + " of 4: Allgather(");
    ASSERT_NE(at, std::string::npos) << log;
    EXPECT_EQ(log.compare(log.find(')', log.find("backend=", at)) + 1, bytes.size(), bytes), 0) << log.substr(at, 200);
  }
}

}  // namespace
}  // namespace meshfuse

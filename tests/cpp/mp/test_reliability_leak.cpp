// Many executes of a cached multi-device fusion (input agreement + allgather + allreduce every
// time) must not grow resident memory or live CPU tensor bytes on any rank.
#include <gtest/gtest.h>

#include "host_ir/fusion_executor.h"
#include "memory_probe.h"
#include "mp_test_utils.h"
#include "multidevice/communicator.h"
#include "ops/ops.h"

namespace meshfuse {
namespace {

using testing::MemorySample;
using testing::randomTensor;
using testing::shardOf;

TEST(MultiDeviceLeakCheck, ThousandsOfCachedExecutesKeepMemoryFlat) {
  Communicator& comm = Communicator::instance();
  const int64_t n = comm.size(), rank = comm.rank();
  std::vector<int64_t> devices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) devices[static_cast<size_t>(i)] = i;
  DeviceMesh world(devices);
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {2 * n, 4});
  f->addInput(x);
  TensorView* gathered = ops::set(x);                              // allgather
  TensorView* total = ops::reduction(OpType::Sum, x, {0}, false);  // partial sums, allreduce
  f->addOutput(gathered);
  f->addOutput(total);
  x->setDeviceMesh(world);
  x->outerSplit(0, n);
  x->parallelize(0, ParallelType::MeshX);
  gathered->setDeviceMesh(world);
  total->setDeviceMesh(world);
  FusionExecutorCache fec(f);
  Tensor full = randomTensor({2 * n, 4}, 81);
  Tensor mine = shardOf(full, 0, n, rank);
  double expected_col0 = 0;
  for (int64_t i = 0; i < 2 * n; ++i) expected_col0 += full.item(i * 4);

  auto runOnce = [&] {
    auto out = fec.execute({mine});
    ASSERT_EQ(out[0].numel(), 8 * n);
    ASSERT_EQ(out[0].item(5), full.item(5));
    ASSERT_NEAR(out[1].item(0), expected_col0, 1e-4);
  };
  for (int i = 0; i < 300; ++i) runOnce();
  MemorySample before;
  const int iterations = 3000;
  for (int i = 0; i < iterations; ++i) {
    runOnce();
    if (::testing::Test::HasFatalFailure()) return;  // every rank fails the same assertion together
  }
  MemorySample after;
  EXPECT_EQ(after.cpu_tensor_bytes, before.cpu_tensor_bytes) << "rank " << rank;
  if (testing::kResidentMemoryIsMeaningful)
    EXPECT_LT(after.resident - before.resident, int64_t{1} << 20)
        << "rank " << rank << ": resident memory grew from " << before.resident << " to " << after.resident;
}

}  // namespace
}  // namespace meshfuse

// A 10,000-iteration execute loop of a small cached fusion must not grow resident memory or the
// bytes held by live CPU tensors: every output, temporary and ValueMap entry is released.
#include <gtest/gtest.h>

#include <random>

#include "host_ir/fusion_executor.h"
#include "memory_probe.h"
#include "ops/ops.h"

namespace meshfuse {
namespace {

using testing::MemorySample;

TEST(LeakCheck, TenThousandCachedExecutesKeepMemoryFlat) {
  // relu(x * w + b) then a sum and a linear: a pointwise, a reduction and a matmul segment.
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {8, 16});
  TensorView* w = f->newTensor(DataType::Float, {4, 16});
  TensorView* b = f->newTensor(DataType::Float, {16});
  f->addInput(x);
  f->addInput(w);
  f->addInput(b);
  TensorView* h = ops::unary(OpType::Relu, ops::binary(OpType::Add, ops::binary(OpType::Mul, x, x), b));
  f->addOutput(ops::reduction(OpType::Sum, h, {1}, false));
  f->addOutput(ops::linear(h, w));
  FusionExecutorCache fec(f);

  std::mt19937 gen(5);
  std::uniform_real_distribution<float> dist(-1, 1);
  auto filled = [&](std::vector<int64_t> shape) {
    Tensor t = Tensor::empty(shape, DataType::Float);
    for (int64_t i = 0; i < t.numel(); ++i) t.dataAs<float>()[i] = dist(gen);
    return t;
  };
  Tensor xt = filled({8, 16}), wt = filled({4, 16}), bt = filled({16});

  // The expected first output, in float64, so the loop is also checked for correctness.
  std::vector<double> row_sums(8, 0.0);
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 16; ++j) {
      double v =
          static_cast<double>(xt.dataAs<float>()[i * 16 + j]) * xt.dataAs<float>()[i * 16 + j] + bt.dataAs<float>()[j];
      row_sums[i] += v > 0 ? v : 0;
    }

  auto runOnce = [&] {
    auto out = fec.execute({xt, wt, bt});
    ASSERT_EQ(out.size(), 2u);
    ASSERT_EQ(out[0].numel(), 8);
    ASSERT_NEAR(out[0].item(3), row_sums[3], 1e-4);
  };
  for (int i = 0; i < 1000; ++i) runOnce();  // warm-up: allocator pools, lazy statics
  MemorySample before;
  for (int i = 0; i < 10000; ++i) {
    runOnce();
    if (::testing::Test::HasFatalFailure()) return;
  }
  MemorySample after;
  EXPECT_EQ(fec.numCachedPrograms(), 1u);
  EXPECT_EQ(after.cpu_tensor_bytes, before.cpu_tensor_bytes) << "live CPU tensor bytes changed";
  // One leaked 128-byte output per iteration would be 1.2 MB; allow 1 MiB of allocator noise.
  if (testing::kResidentMemoryIsMeaningful)
    EXPECT_LT(after.resident - before.resident, int64_t{1} << 20)
        << "resident memory grew from " << before.resident << " to " << after.resident << " bytes";
}

}  // namespace
}  // namespace meshfuse

// The CUDA attention dropout mask (runtime/cuda/dropout_mask.h) element by element against the
// stream drawn one element at a time on the CPU (philox::drawElement at the element's global index,
// AttentionParams::dropoutIndex): rows whose length is odd (s_kv = 17, 1001) so that rows start and
// end mid-counter, rows of whole 8-element groups (a thread's one 16-byte store, two for fp32), a
// sharded (batch, head) block, causal rows (0 past the diagonal), every mask dtype, both memory
// orders (the key-major kernel's [64, 64] tiles: partial ones at both edges, several along each
// axis), at p = 0.2, whose float times 2^24 is not an integer (the kernel's integer keep bound
// rounds it up).
// Skipped without a GPU (the kernel's source compiles in test_cuda_codegen.cpp).
#include <gtest/gtest.h>

#if MESHFUSE_HAVE_CUDA
#include <string>
#include <vector>

#include "runtime/cuda/attention_rng.h"
#include "runtime/cuda/dropout_mask.h"
#include "runtime/cuda/streams.h"
#include "runtime/half.h"
#include "runtime/philox.h"

namespace meshfuse {
namespace {

float maskValue(const Tensor& mask, int64_t e) {
  const auto* p = static_cast<const char*>(mask.data());
  switch (mask.dtype()) {
    // cppcheck-suppress invalidPointerCast ; the bytes are floats (the mask's dtype says so)
    case DataType::Float: return reinterpret_cast<const float*>(p)[e];
    case DataType::Half: return halfToFloat(reinterpret_cast<const uint16_t*>(p)[e]);
    default: return bf16ToFloat(reinterpret_cast<const uint16_t*>(p)[e]);
  }
}

// How a drawn mask (query-major, on the CPU) compares with the CPU's draws element by element:
// elements whose kept/dropped state or kept value (`keep`, the keep scale in the mask's dtype)
// differ, and how many the CPU keeps.
struct Agreement {
  int64_t differ = 0, kept = 0, elements = 0;
};
Agreement agreementWithCpuDraws(const Tensor& mask, const AttentionParams& p, float keep) {
  Agreement a;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i)
        for (int64_t j = 0; j < p.seq_kv; ++j, ++a.elements) {
          const double u = philox::drawElement(p.dropoutIndex(b, h, i, j), p.offset, p.seed, false, false, 0, 1);
          const bool want = (!p.causal || j <= i) && static_cast<float>(u) >= static_cast<float>(p.dropout_p);
          const float got = maskValue(mask, a.elements);
          a.differ += (got != 0) != want || (want && got != keep);
          a.kept += want;
        }
  return a;
}

TEST(CudaDropoutMask, EveryElementIsItsGlobalIndexsDraw) {
  std::string why;
  if (cuda::deviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  struct Shape {
    int64_t batch, heads, seq_q, seq_kv, batch_offset, head_offset, global_heads;
  };
  const std::vector<Shape> shapes = {
      {2, 3, 9, 17, 0, 0, 3},   {1, 2, 5, 1001, 1, 3, 7},  // a shard: batch 1, heads 3..4 of 7
      {1, 1, 64, 64, 0, 0, 1},  {2, 1, 33, 130, 0, 1, 2},
      {1, 2, 130, 71, 0, 0, 2}, {1, 2, 12, 2048, 0, 5, 8}};  // whole 16-byte groups, as the GPT-3 rows
  for (const Shape& s : shapes)
    for (bool causal : {false, true})
      for (DataType dtype : {DataType::Float, DataType::Half, DataType::BFloat16})
        for (cuda::MaskOrder order : {cuda::MaskOrder::QueryMajor, cuda::MaskOrder::KeyMajor}) {
          AttentionParams p;
          p.batch = s.batch;
          p.heads = s.heads;
          p.seq_q = s.seq_q;
          p.seq_kv = s.seq_kv;
          p.batch_offset = s.batch_offset;
          p.head_offset = s.head_offset;
          p.global_heads = s.global_heads;
          p.causal = causal;
          p.dropout_p = 0.2;  // keep scale 1.25: exact in every mask dtype
          p.seed = (1ull << 40) + 17;
          p.offset = 12345;
          const bool key_major = order == cuda::MaskOrder::KeyMajor;
          SCOPED_TRACE("s_q " + std::to_string(s.seq_q) + " s_kv " + std::to_string(s.seq_kv) +
                       (causal ? " causal " : " ") + toString(dtype) + (key_major ? " key-major" : " query-major"));
          const Tensor drawn = cuda::dropoutMask(0, p, dtype, nullptr, nullptr, order);
          ASSERT_EQ(drawn.shape(), (std::vector<int64_t>{s.batch, s.heads, s.seq_q, s.seq_kv}));
          // Key-major: the view of a [b, h, s_kv, s_q] buffer (a query's neighbour is the next element).
          EXPECT_EQ(drawn.strides()[2] == 1, key_major);
          const Agreement a = agreementWithCpuDraws(drawn.contiguous().to(Device::cpu()), p, 1.25f);  // keep scale
          EXPECT_EQ(a.differ, 0);
          EXPECT_GT(a.kept, 0);
        }
}

// The integer keep bound at its edges: p whose float times 2^24 is an integer (0.5: the bound is
// that integer, not one above it), a p below 1 whose float rounds to 1 (nothing is kept, as on the
// CPU, where no uniform reaches 1), and p = 0 (everything kept).
TEST(CudaDropoutMask, KeepBoundAtItsEdges) {
  std::string why;
  if (cuda::deviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  for (double dropout_p : {0.5, 1.0 - 1e-9, 0.0}) {
    SCOPED_TRACE("p " + std::to_string(dropout_p));
    AttentionParams p;
    p.batch = 1;
    p.heads = p.global_heads = 2;
    p.seq_q = 8;
    p.seq_kv = 512;
    p.dropout_p = dropout_p;
    p.seed = 99;
    p.offset = 7;
    const Tensor mask = cuda::dropoutMask(0, p, DataType::Float).to(Device::cpu());
    const Agreement a = agreementWithCpuDraws(mask, p, static_cast<float>(1.0 / (1.0 - dropout_p)));
    EXPECT_EQ(a.differ, 0);
    if (dropout_p > 0.9) EXPECT_EQ(a.kept, 0);
    if (dropout_p == 0.0) EXPECT_EQ(a.kept, a.elements);
  }
}

// The forward's philox_seed and philox_offset outputs: two 0-dim Int views of one buffer, written by
// one kernel.
TEST(CudaDropoutMask, PhiloxScalarsHoldTheSeedAndTheOffset) {
  std::string why;
  if (cuda::deviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const int64_t seed = (int64_t{1} << 40) + 17, offset = 123456789;
  const auto [s, o] = cuda::devicePhiloxScalars(0, seed, offset);
  for (const Tensor* t : {&s, &o}) {
    EXPECT_EQ(t->dim(), 0);
    EXPECT_EQ(t->dtype(), DataType::Int);
    EXPECT_EQ(t->device(), Device::cuda(0));
  }
  EXPECT_EQ(s.to(Device::cpu()).dataAs<int64_t>()[0], seed);
  EXPECT_EQ(o.to(Device::cpu()).dataAs<int64_t>()[0], offset);
}

// The words cuDNN's generator reads for a shard (attention_rng.h): the kernel mixes the seed exactly
// as the host's mixShardSeed, from device words (the backward's inputs) or from host values (the
// forward's), keeps the offset, and leaves key 0's seed alone.
TEST(CudaDropoutMask, ShardWordsMixTheSeedAsTheHostDoes) {
  std::string why;
  if (cuda::deviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const uint64_t seed = (uint64_t{1} << 40) + 17, offset = 987654321;
  const auto [device_seed, device_offset] =
      cuda::devicePhiloxScalars(0, static_cast<int64_t>(seed), static_cast<int64_t>(offset));
  for (uint64_t key : {uint64_t{0}, uint64_t{1}, uint64_t{3}, uint64_t{96 * 7 + 5}}) {
    SCOPED_TRACE("key " + std::to_string(key));
    for (bool from_device : {true, false}) {
      const auto [s, o] = from_device ? cuda::cudnnPhiloxWords(0, device_seed.data(), device_offset.data(), 0, 0, key)
                                      : cuda::cudnnPhiloxWords(0, nullptr, nullptr, seed, offset, key);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % 16, 0u);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(o.data()) % 16, 0u);
      EXPECT_EQ(static_cast<uint64_t>(s.to(Device::cpu()).dataAs<int64_t>()[0]), cuda::mixShardSeed(seed, key));
      EXPECT_EQ(static_cast<uint64_t>(o.to(Device::cpu()).dataAs<int64_t>()[0]), offset);
    }
  }
}

}  // namespace
}  // namespace meshfuse
#endif  // MESHFUSE_HAVE_CUDA

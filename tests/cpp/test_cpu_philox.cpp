// The vectorized Philox block (runtime/cpu/philox_block.h) against the scalar generator it must
// match bit for bit (runtime/philox.h, which the CUDA kernels are checked against): random
// counters with carries into the high word, random offsets and seeds, block lengths that are not
// multiples of any vector width.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "runtime/cpu/philox_block.h"
#include "runtime/philox.h"

namespace meshfuse {
namespace {

// Every build this CPU runs (on an AVX-512 machine: both), and the one philoxWords picks.
TEST(CpuPhiloxBlock, WordsMatchTheScalarGenerator) {
  std::vector<cpu::PhiloxBuild> builds = cpu::philoxBuilds();
  builds.push_back({"philoxWords", cpu::philoxWords});
  std::mt19937_64 rng(7);
  for (const cpu::PhiloxBuild& build : builds)
    for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 127, 1000}) {
      std::vector<uint64_t> index(n);
      const uint64_t start = rng() | 0xFFFFFFF0ull;  // low word about to carry into the high word
      for (int64_t i = 0; i < n; ++i) index[i] = i % 2 == 0 ? start + i : rng();
      const uint64_t offset = rng(), seed = rng();
      std::vector<uint32_t> w[4];
      for (auto& v : w) v.assign(n, 0);
      build.words(index.data(), n, offset, seed, w[0].data(), w[1].data(), w[2].data(), w[3].data());
      for (int64_t i = 0; i < n; ++i) {
        const auto expected = philox::generate(index[i], offset, seed);
        for (int k = 0; k < 4; ++k)
          ASSERT_EQ(w[k][i], expected[k]) << build.name << ": n " << n << " element " << i << " word " << k;
      }
    }
}

TEST(CpuPhiloxBlock, UniformFloatsRoundLikeTheScalarFormula) {
  std::mt19937 rng(11);
  const int64_t n = 1001;
  std::vector<uint32_t> w(n);
  for (auto& v : w) v = static_cast<uint32_t>(rng());
  w[0] = 0xFFFFFFFFu;  // the largest unit value, 1 - 2^-24
  w[1] = 0;
  for (const auto [lo, hi] : {std::pair{0.0f, 1.0f}, std::pair{-3.0f, 2.5f}, std::pair{2.0f, 5.0f}}) {
    std::vector<float> out(n);
    cpu::uniformFloats(w.data(), n, lo, hi, out.data());
    for (int64_t i = 0; i < n; ++i) {
      const std::array<uint32_t, 4> words{w[i], 0, 0, 0};
      ASSERT_EQ(out[i], static_cast<float>(philox::uniformFrom(words, lo, hi, false))) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace meshfuse

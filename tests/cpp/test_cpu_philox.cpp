// The vectorized Philox block (runtime/cpu/philox_block.h) against the scalar generator it must
// match bit for bit (runtime/philox.h, which the CUDA kernels are checked against), the scalar
// generator against the published known-answer vectors, and the stream's element mapping (element
// g of a draw whose elements take W words: counter g / (4 / W), words from (g % (4 / W)) * W).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "runtime/cpu/philox_block.h"
#include "runtime/philox.h"

namespace meshfuse {
namespace {

// Random123's known-answer vectors for Philox4x32-10 (kat_vectors: counter, key, output). Our
// counter words are {counter low, counter high, offset low, offset high}, the key {seed low, high}.
TEST(CpuPhilox, KnownAnswerVectors) {
  EXPECT_EQ(philox::generate(0, 0, 0), (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox::generate(~0ull, ~0ull, ~0ull),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox::generate(0x85a308d3243f6a88ull, 0x0370734413198a2eull, 0x299f31d0a4093822ull),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// Every build this CPU runs (on an AVX-512 machine: both), and the one philoxWords picks; counters
// in runs (as the kernels pass them) and scattered, block lengths that are not multiples of any
// vector width (the AVX-512 build's padded last vector).
TEST(CpuPhiloxBlock, WordsMatchTheScalarGenerator) {
  std::vector<cpu::PhiloxBuild> builds = cpu::philoxBuilds();
  builds.push_back({"philoxWords", cpu::philoxWords});
  std::mt19937_64 rng(7);
  for (const cpu::PhiloxBuild& build : builds)
    for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 127, 1000}) {
      std::vector<uint64_t> counter(n);
      const uint64_t start = rng() | 0xFFFFFFF0ull;  // low word about to carry into the high word
      for (int64_t i = 0; i < n; ++i) counter[i] = i % 3 != 2 ? start + i : rng();
      const uint64_t offset = rng(), seed = rng();
      std::vector<uint32_t> out(4 * n + 1, 0xABCDEF01u);
      build.words(counter.data(), n, offset, seed, out.data());
      for (int64_t i = 0; i < n; ++i) {
        const auto expected = philox::generate(counter[i], offset, seed);
        for (int k = 0; k < 4; ++k)
          ASSERT_EQ(out[4 * i + k], expected[k]) << build.name << ": n " << n << " counter " << i << " word " << k;
      }
      EXPECT_EQ(out[4 * n], 0xABCDEF01u) << build.name << ": wrote past the end";
    }
}

// Elements take consecutive stream words: a Float uniform word g % 4 of counter g / 4, a Double
// uniform and a Float normal two words of counter g / 2, a Double normal counter g.
TEST(CpuPhilox, ElementsTakeConsecutiveStreamWords) {
  const uint64_t offset = 0x123456789ull, seed = 42;
  for (uint64_t g : {0ull, 1ull, 2ull, 3ull, 4ull, 5ull, 1001ull, (1ull << 34) + 3}) {
    const auto word = [&](uint64_t k) { return philox::generate(k / 4, offset, seed)[k % 4]; };
    EXPECT_EQ(philox::drawElement(g, offset, seed, false, false, 0, 1), philox::unitFloat(word(g)));
    EXPECT_EQ(philox::drawElement(g, offset, seed, false, true, 0, 1),
              philox::unitDouble(word(2 * g), word(2 * g + 1)));
    const uint32_t fw[2] = {word(2 * g), word(2 * g + 1)};
    EXPECT_EQ(philox::drawElement(g, offset, seed, true, false, 0, 1), philox::normalFrom(fw, 0, 1, false));
    const uint32_t dw[4] = {word(4 * g), word(4 * g + 1), word(4 * g + 2), word(4 * g + 3)};
    EXPECT_EQ(philox::drawElement(g, offset, seed, true, true, 0, 1), philox::normalFrom(dw, 0, 1, true));
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
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(out[i], static_cast<float>(philox::uniformFrom(&w[i], lo, hi, false))) << "element " << i;
  }
}

}  // namespace
}  // namespace meshfuse

// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator behind uniform(), normal() and fused attention's dropout mask.
//
// The stream of a draw with (seed, offset): counter c (key {seed}, counter words {c, offset})
// gives the four 32-bit words 4c .. 4c + 3 of one stream. Element g (its row-major index in the
// global tensor) takes the W words g * W .. g * W + W - 1, W = wordsPerElement: a Float-precision
// uniform (and the attention mask's) takes one word, so element g is word g % 4 of counter g / 4;
// a Double uniform (53 bits) and a Float normal (Box-Muller on two uniforms) take two, two elements
// a counter; a Double normal takes all four, one element a counter. One Philox block (ten rounds)
// thus serves up to four elements, where it served one before. A value still depends on nothing
// but (seed, offset, g): CPU and CUDA produce the same bits, and a shard computes its block of the
// one global tensor alone (its first and last elements may sit mid-counter: it draws the whole
// counter and takes the words it owns). The CUDA code generator emits the same arithmetic as text
// (runtime/cuda); keep the two in step (tests compare them, and tests/python/philox_reference.py
// re-implements the stream in numpy).
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

namespace meshfuse::philox {

constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;    // the round's multipliers
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // the key's step per round

// One of the ten rounds on counter (c0..c3) and key (k0, k1); the key then moves on by the Weyl
// constants. Always inlined, so that a loop of rounds over many counters vectorizes
// (runtime/cpu/philox_block.cpp).
[[gnu::always_inline]] inline void oneRound(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3, uint32_t& k0,
                                            uint32_t& k1) {
  const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
  const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
  const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
  const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
  c1 = static_cast<uint32_t>(p1);
  c3 = static_cast<uint32_t>(p0);
  c0 = n0;
  c2 = n2;
  k0 += kWeyl0;
  k1 += kWeyl1;
}

// The four words of counter `counter` (the stream's words 4 * counter .. 4 * counter + 3).
inline std::array<uint32_t, 4> generate(uint64_t counter, uint64_t offset, uint64_t seed) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(offset), c3 = static_cast<uint32_t>(offset >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) oneRound(c0, c1, c2, c3, k0, k1);
  return {c0, c1, c2, c3};
}

// Words an element takes from the stream, and elements a counter serves (4 / words).
inline int wordsPerElement(bool normal, bool wide) { return (normal ? 2 : 1) * (wide ? 2 : 1); }

// The counter of element g and the position of its first word in that counter's four.
struct ElementSlot {
  uint64_t counter;
  int word;
};
inline ElementSlot elementSlot(uint64_t g, int words_per_element) {
  const int per_counter = 4 / words_per_element;
  return {g / static_cast<uint64_t>(per_counter),
          static_cast<int>(g % static_cast<uint64_t>(per_counter)) * words_per_element};
}

// [0, 1) from the top 24 bits of one word (float precision) or 53 bits of two (double precision).
inline float unitFloat(uint32_t r) { return static_cast<float>(r >> 8) * 0x1p-24f; }
inline double unitDouble(uint32_t hi, uint32_t lo) {
  return static_cast<double>(((static_cast<uint64_t>(hi) << 32) | lo) >> 11) * 0x1p-53;
}

// uniform(lo, hi) and normal(mean, std) from an element's words w[0 .. wordsPerElement): `wide`: a
// Double output, drawn with 53-bit uniforms; otherwise 24-bit ones computed in float (what the CUDA
// kernels do).
inline double uniformFrom(const uint32_t* w, double lo, double hi, bool wide) {
  if (wide) return lo + (hi - lo) * unitDouble(w[0], w[1]);
  return static_cast<double>(static_cast<float>(lo) +
                             (static_cast<float>(hi) - static_cast<float>(lo)) * unitFloat(w[0]));
}

// Box-Muller on two uniforms (the cosine half only, so that an element's value needs no other
// element's words), the first moved to (0, 1] so that its log is finite.
inline double normalFrom(const uint32_t* w, double mean, double stddev, bool wide) {
  constexpr double kTwoPi = 6.283185307179586476925;
  if (wide) {
    const double u1 = unitDouble(w[0], w[1]) + 0x1p-53, u2 = unitDouble(w[2], w[3]);
    return mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
  }
  const float u1 = unitFloat(w[0]) + 0x1p-24f, u2 = unitFloat(w[1]);
  const float z = std::sqrt(-2.0f * std::log(u1)) * std::cos(static_cast<float>(kTwoPi) * u2);
  return static_cast<double>(static_cast<float>(mean) + static_cast<float>(stddev) * z);
}

// Element g's value, one element at a time: the reference the block paths are tested against.
inline double drawElement(uint64_t g, uint64_t offset, uint64_t seed, bool normal, bool wide, double a, double b) {
  const ElementSlot slot = elementSlot(g, wordsPerElement(normal, wide));
  const std::array<uint32_t, 4> r = generate(slot.counter, offset, seed);
  const uint32_t* w = r.data() + slot.word;
  return normal ? normalFrom(w, a, b, wide) : uniformFrom(w, a, b, wide);
}

}  // namespace meshfuse::philox

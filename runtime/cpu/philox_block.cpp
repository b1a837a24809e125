// philoxWords has two builds: an AVX-512 one with intrinsics, picked at run time where the CPU has
// AVX-512, and the portable loop (itself cloned for AVX2 and the baseline). For AVX-512 GCC
// vectorizes the portable loop with 64-bit lane multiplies (vpmullq, several micro-ops each); the
// round needs only 32 x 32 -> 64-bit products, which vpmuludq makes in one.
// Built with -ffp-contract=off (CMakeLists.txt): uniformFloats must round the product before the
// sum, or a clone would fuse them and differ from the CUDA kernels.
#include "runtime/cpu/philox_block.h"

#include <immintrin.h>

#include <algorithm>

#include "runtime/cpu/simd_clones.h"
#include "runtime/philox.h"

namespace meshfuse::cpu {

namespace {

using philox::kMul0;
using philox::kMul1;
using philox::kWeyl0;
using philox::kWeyl1;

void philoxWordsPortable(const uint64_t* counter, int64_t n, uint64_t offset, uint64_t seed, uint32_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const auto r = philox::generate(counter[i], offset, seed);
    for (int k = 0; k < 4; ++k) out[4 * i + k] = r[k];
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(MESHFUSE_NO_SIMD_CLONES)
#define MESHFUSE_PHILOX_X86 1
// GCC 12's shift and multiply intrinsics pass _mm512_undefined_epi32() (a self-initialized
// variable) as their unused merge operand, which -Wmaybe-uninitialized reports at every use.
#if !defined(__clang__)  // a GCC warning (clang, which clang-tidy parses with, has no such group)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// Each counter's four state words sit in the low halves of 64-bit lanes, 8 counters a vector:
// vpmuludq then makes a round's full 32 x 32 -> 64-bit product in one instruction (the low word is
// the product's low half as it is, the high word one shift away), and the three-way xor is one
// vpternlogq. The high halves of the lanes carry junk that never reaches a low half (vpmuludq reads
// only the low halves; xor is lane-wise). kVectors vectors are in flight at once, so that the
// multiplier's latency is hidden: 1.8 ns a counter on this Xeon against 2.4 for 16 counters in
// 32-bit lanes with the products' halves blended back. The words leave counter by counter (the
// stream's order): words 0 and 1 (2 and 3) of a counter are blended into one 64-bit lane, and two
// two-source permutes interleave those lanes into counters 0-3 and 4-7.
constexpr int kVectors = 4;

template <int V>
__attribute__((target("avx512f"))) inline int64_t philoxLanes(const uint64_t* counter, int64_t n, uint64_t offset,
                                                              uint64_t seed, uint32_t* out) {
  const __m512i low4 = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0), high4 = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
  const __m512i m0 = _mm512_set1_epi64(kMul0), m1 = _mm512_set1_epi64(kMul1);
  __m512i k0[10], k1[10];
  uint32_t a = static_cast<uint32_t>(seed), b = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r, a += kWeyl0, b += kWeyl1) {
    k0[r] = _mm512_set1_epi64(a);
    k1[r] = _mm512_set1_epi64(b);
  }
  const __m512i o0 = _mm512_set1_epi64(static_cast<uint32_t>(offset)), o1 = _mm512_set1_epi64(offset >> 32);
  int64_t i = 0;
  for (; i + 8 * V <= n; i += 8 * V) {
    __m512i c[V][4];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      c[v][0] = _mm512_loadu_si512(counter + i + 8 * v);  // the counter's low word (and its high word above it)
      c[v][1] = _mm512_srli_epi64(c[v][0], 32);
      c[v][2] = o0;
      c[v][3] = o1;
    }
#pragma GCC unroll 10
    for (int r = 0; r < 10; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) {
        const __m512i p0 = _mm512_mul_epu32(c[v][0], m0), p1 = _mm512_mul_epu32(c[v][2], m1);
        c[v][0] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), c[v][1], k0[r], 0x96);  // a ^ b ^ c
        c[v][2] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), c[v][3], k1[r], 0x96);
        c[v][1] = p1;
        c[v][3] = p0;
      }
    }
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const __m512i w01 = _mm512_mask_blend_epi32(0xAAAA, c[v][0], _mm512_slli_epi64(c[v][1], 32));
      const __m512i w23 = _mm512_mask_blend_epi32(0xAAAA, c[v][2], _mm512_slli_epi64(c[v][3], 32));
      uint32_t* o = out + 4 * (i + 8 * v);
      _mm512_storeu_si512(o, _mm512_permutex2var_epi64(w01, low4, w23));
      _mm512_storeu_si512(o + 16, _mm512_permutex2var_epi64(w01, high4, w23));
    }
  }
  return i;
}

// The last n % 8 counters go through one more vector, padded, rather than the scalar rounds (a
// causal attention row or a tile's edge often leaves a few).
__attribute__((target("avx512f"))) void philoxWordsAvx512(const uint64_t* counter, int64_t n, uint64_t offset,
                                                          uint64_t seed, uint32_t* out) {
  int64_t i = philoxLanes<kVectors>(counter, n, offset, seed, out);
  i += philoxLanes<1>(counter + i, n - i, offset, seed, out + 4 * i);
  if (i == n) return;
  uint64_t last[8] = {};
  uint32_t words[32];
  std::copy(counter + i, counter + n, last);
  philoxLanes<1>(last, 8, offset, seed, words);
  std::copy(words, words + 4 * (n - i), out + 4 * i);
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

}  // namespace

void philoxWords(const uint64_t* counter, int64_t n, uint64_t offset, uint64_t seed, uint32_t* out) {
  static const PhiloxWordsFn best = philoxBuilds().front().words;
  best(counter, n, offset, seed, out);
}

std::vector<PhiloxBuild> philoxBuilds() {
  std::vector<PhiloxBuild> builds;
#ifdef MESHFUSE_PHILOX_X86
  if (__builtin_cpu_supports("avx512f")) builds.push_back({"avx512", philoxWordsAvx512});
#endif
  builds.push_back({"portable", philoxWordsPortable});
  return builds;
}

MESHFUSE_SIMD_CLONES void uniformFloats(const uint32_t* __restrict w, int64_t n, float lo, float hi,
                                        float* __restrict out) {
  const float span = hi - lo;
  for (int64_t i = 0; i < n; ++i) out[i] = lo + span * philox::unitFloat(w[i]);
}

}  // namespace meshfuse::cpu

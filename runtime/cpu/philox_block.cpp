// philoxWords has two builds: an AVX-512 one with intrinsics, picked at run time where the CPU has
// AVX-512, and the portable loop (itself cloned for AVX2 and the baseline). For AVX-512 GCC
// vectorizes the portable loop with 64-bit lane multiplies (vpmullq, several micro-ops each); the
// round needs only 32 x 32 -> 64-bit products, which vpmuludq makes in one, for every other lane.
// Built with -ffp-contract=off (CMakeLists.txt): uniformFloats must round the product before the
// sum, or a clone would fuse them and differ from the CUDA kernels.
#include "runtime/cpu/philox_block.h"

#include <immintrin.h>

#include "runtime/cpu/simd_clones.h"
#include "runtime/philox.h"

namespace meshfuse::cpu {

namespace {

using philox::kMul0;
using philox::kMul1;
using philox::kWeyl0;
using philox::kWeyl1;

void philoxWordsPortable(const uint64_t* index, int64_t begin, int64_t n, uint64_t offset, uint64_t seed, uint32_t* w0,
                         uint32_t* w1, uint32_t* w2, uint32_t* w3) {
  for (int64_t i = begin; i < n; ++i) {
    const auto r = philox::generate(index[i], offset, seed);
    w0[i] = r[0];
    w1[i] = r[1];
    w2[i] = r[2];
    w3[i] = r[3];
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(MESHFUSE_NO_SIMD_CLONES)
#define MESHFUSE_PHILOX_X86 1
// GCC 12's shift and multiply intrinsics pass _mm512_undefined_epi32() (a self-initialized
// variable) as their unused merge operand, which -Wmaybe-uninitialized reports at every use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The high and low 32 bits of a * b for each 32-bit lane of `a` (b: the constant in every lane).
// vpmuludq multiplies the even lanes; the odd lanes are shifted down and multiplied the same way.
__attribute__((target("avx512f"))) inline void mulHiLo(__m512i a, __m512i b, __m512i& hi, __m512i& lo) {
  const __m512i even = _mm512_mul_epu32(a, b);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), b);
  constexpr __mmask16 kOdd = 0xAAAA;
  hi = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(even, 32), odd);
  lo = _mm512_mask_blend_epi32(kOdd, even, _mm512_slli_epi64(odd, 32));
}

__attribute__((target("avx512f"))) void philoxWordsAvx512(const uint64_t* index, int64_t n, uint64_t offset,
                                                          uint64_t seed, uint32_t* w0, uint32_t* w1, uint32_t* w2,
                                                          uint32_t* w3) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(kMul0)), m1 = _mm512_set1_epi32(static_cast<int>(kMul1));
  // The 16 indices' low and high words: two loads of 8 uint64, split by a permutation.
  const __m512i low_words = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i high_words = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i a = _mm512_loadu_si512(index + i), b = _mm512_loadu_si512(index + i + 8);
    __m512i c0 = _mm512_permutex2var_epi32(a, low_words, b);
    __m512i c1 = _mm512_permutex2var_epi32(a, high_words, b);
    __m512i c2 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(offset)));
    __m512i c3 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(offset >> 32)));
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < 10; ++r) {
      __m512i hi0, lo0, hi1, lo1;
      mulHiLo(c0, m0, hi0, lo0);
      mulHiLo(c2, m1, hi1, lo1);
      const __m512i n0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
      const __m512i n2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
      c1 = lo1;
      c3 = lo0;
      c0 = n0;
      c2 = n2;
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    _mm512_storeu_si512(w0 + i, c0);
    _mm512_storeu_si512(w1 + i, c1);
    _mm512_storeu_si512(w2 + i, c2);
    _mm512_storeu_si512(w3 + i, c3);
  }
  philoxWordsPortable(index, i, n, offset, seed, w0, w1, w2, w3);
}
#pragma GCC diagnostic pop
#endif

}  // namespace

void philoxWords(const uint64_t* index, int64_t n, uint64_t offset, uint64_t seed, uint32_t* w0, uint32_t* w1,
                 uint32_t* w2, uint32_t* w3) {
  static const PhiloxWordsFn best = philoxBuilds().front().words;
  best(index, n, offset, seed, w0, w1, w2, w3);
}

std::vector<PhiloxBuild> philoxBuilds() {
  std::vector<PhiloxBuild> builds;
#ifdef MESHFUSE_PHILOX_X86
  if (__builtin_cpu_supports("avx512f")) builds.push_back({"avx512", philoxWordsAvx512});
#endif
  builds.push_back(
      {"portable", [](const uint64_t* index, int64_t n, uint64_t offset, uint64_t seed, uint32_t* w0, uint32_t* w1,
                      uint32_t* w2, uint32_t* w3) { philoxWordsPortable(index, 0, n, offset, seed, w0, w1, w2, w3); }});
  return builds;
}

MESHFUSE_SIMD_CLONES void uniformFloats(const uint32_t* __restrict w, int64_t n, float lo, float hi,
                                        float* __restrict out) {
  const float span = hi - lo;
  for (int64_t i = 0; i < n; ++i) out[i] = lo + span * philox::unitFloat(w[i]);
}

}  // namespace meshfuse::cpu

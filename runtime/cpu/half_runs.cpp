#include "runtime/cpu/half_runs.h"

#include "runtime/cpu/simd_clones.h"

#ifdef MESHFUSE_X86_TARGETS
#include <immintrin.h>
#endif

namespace meshfuse::cpu {

namespace {

// ---- Portable: the select forms of half_runs.h, vectorized by GCC in each SIMD clone ----------

MESHFUSE_SIMD_CLONES void halfToFloatPortable(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = halfToFloatSelect(src[i]);
}

MESHFUSE_SIMD_CLONES void floatToHalfPortable(const float* __restrict src, uint16_t* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = floatToHalfSelect(src[i]);
}

// x rounded to 16 bits and read back; `round` is Half's or BFloat16's pair of conversions.
template <typename Round>
[[gnu::always_inline]] inline void roundThrough(const float* src, float* dst, int64_t n, Round round) {
  // In place, the loop reads and writes one pointer: two that may overlap would make GCC check
  // the overlap at run time, and an exact overlap (src == dst) fails that check into scalar code.
  if (src == dst) {
    for (int64_t i = 0; i < n; ++i) dst[i] = round(dst[i]);
    return;
  }
  const float* __restrict in = src;
  float* __restrict out = dst;
  for (int64_t i = 0; i < n; ++i) out[i] = round(in[i]);
}

MESHFUSE_SIMD_CLONES void roundThroughHalfPortable(const float* src, float* dst, int64_t n) {
  roundThrough(src, dst, n, [](float x) { return halfToFloatSelect(floatToHalfSelect(x)); });
}

#ifdef MESHFUSE_X86_TARGETS
// ---- F16C: one instruction per vector converts; NaN lanes are then set as the reference sets them.
// The rounding is the instruction's immediate (nearest even), not MXCSR's mode, and F16C ignores
// MXCSR's FTZ and DAZ for these conversions, so the results are the reference's under any MXCSR
// (the tests check with FTZ, DAZ and upward rounding set). Element by element the conversions are
// independent, so the tails go through the select forms (AVX2) or masked loads and stores (AVX-512).

// GCC 12's AVX-512 headers fill unused result registers from a self-initialized variable
// (_mm512_undefined_*), which -Wmaybe-uninitialized flags at every use (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

constexpr int kRoundNearestEven = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
constexpr int kFloatQuietBit = 0x400000;

// vcvtph2ps quiets a signaling NaN (sets float's quiet bit); halfToFloat keeps the half's own bit.
MESHFUSE_TARGET_V4 inline __m512 halfToFloat16(__m256i h) {
  const __m512i wide = _mm512_cvtepu16_epi32(h);
  const __m512i converted = _mm512_castps_si512(_mm512_cvtph_ps(h));
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(wide, _mm512_set1_epi32(0x7fff)), _mm512_set1_epi32(0x7c00));
  const __m512i own_quiet_bit = _mm512_and_si512(_mm512_slli_epi32(wide, 13), _mm512_set1_epi32(kFloatQuietBit));
  const __m512i kept =
      _mm512_or_si512(_mm512_andnot_si512(_mm512_set1_epi32(kFloatQuietBit), converted), own_quiet_bit);
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(converted, nan, kept));
}

// vcvtps2ph keeps a NaN's sign and top payload bits; floatToHalf gives the plain quiet NaN.
MESHFUSE_TARGET_V4 inline __m256i floatToHalf16(__m512 f) {
  const __m256i h = _mm512_cvtps_ph(f, kRoundNearestEven);
  const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  const __m256i quiet_nan =
      _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16(static_cast<int16_t>(0x8000))), _mm256_set1_epi16(0x7e00));
  return _mm256_mask_mov_epi16(h, nan, quiet_nan);
}

// The lanes of the last, partial vector of a run of n.
MESHFUSE_TARGET_V4 inline __mmask16 tailMask(int64_t n) {
  return static_cast<__mmask16>((1u << static_cast<unsigned>(n % 16)) - 1u);
}

MESHFUSE_TARGET_V4 void halfToFloatAvx512(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, halfToFloat16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  if (i == n) return;
  const __mmask16 m = tailMask(n);
  _mm512_mask_storeu_ps(dst + i, m, halfToFloat16(_mm256_maskz_loadu_epi16(m, src + i)));
}

MESHFUSE_TARGET_V4 void floatToHalfAvx512(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), floatToHalf16(_mm512_loadu_ps(src + i)));
  if (i == n) return;
  const __mmask16 m = tailMask(n);
  _mm256_mask_storeu_epi16(dst + i, m, floatToHalf16(_mm512_maskz_loadu_ps(m, src + i)));
}

// Half's quiet NaN converts exactly, so the round trip needs no fix beyond floatToHalf16's.
MESHFUSE_TARGET_V4 void roundThroughHalfAvx512(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(floatToHalf16(_mm512_loadu_ps(src + i))));
  if (i == n) return;
  const __mmask16 m = tailMask(n);
  _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(floatToHalf16(_mm512_maskz_loadu_ps(m, src + i))));
}

MESHFUSE_TARGET_V3 inline __m256 halfToFloat8(__m128i h) {
  const __m256i wide = _mm256_cvtepu16_epi32(h);
  const __m256i converted = _mm256_castps_si256(_mm256_cvtph_ps(h));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(wide, _mm256_set1_epi32(0x7fff)), _mm256_set1_epi32(0x7c00));
  const __m256i own_quiet_bit = _mm256_and_si256(_mm256_slli_epi32(wide, 13), _mm256_set1_epi32(kFloatQuietBit));
  const __m256i kept =
      _mm256_or_si256(_mm256_andnot_si256(_mm256_set1_epi32(kFloatQuietBit), converted), own_quiet_bit);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(converted, kept, nan));
}

MESHFUSE_TARGET_V3 inline __m128i floatToHalf8(__m256 f) {
  const __m128i h = _mm256_cvtps_ph(f, kRoundNearestEven);
  const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  const __m128i nan = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
  const __m128i quiet_nan =
      _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(static_cast<int16_t>(0x8000))), _mm_set1_epi16(0x7e00));
  return _mm_blendv_epi8(h, quiet_nan, nan);
}

MESHFUSE_TARGET_V3 void halfToFloatAvx2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, halfToFloat8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = halfToFloatSelect(src[i]);
}

MESHFUSE_TARGET_V3 void floatToHalfAvx2(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), floatToHalf8(_mm256_loadu_ps(src + i)));
  for (; i < n; ++i) dst[i] = floatToHalfSelect(src[i]);
}

MESHFUSE_TARGET_V3 void roundThroughHalfAvx2(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(floatToHalf8(_mm256_loadu_ps(src + i))));
  for (; i < n; ++i) dst[i] = halfToFloatSelect(floatToHalfSelect(src[i]));
}
#pragma GCC diagnostic pop
#endif  // MESHFUSE_X86_TARGETS

}  // namespace

namespace half_detail {

HalfIsa bestHalfIsa() {
#ifdef MESHFUSE_X86_TARGETS
  __builtin_cpu_init();  // may run in a static initializer, before the CPU model is otherwise known
  if (__builtin_cpu_supports("x86-64-v4")) return HalfIsa::Avx512F16c;
  if (__builtin_cpu_supports("x86-64-v3")) return HalfIsa::Avx2F16c;  // v3 includes F16C
#endif
  return HalfIsa::Portable;
}

namespace {
// One conversion's implementations: the AVX-512 and AVX2 ones exist where the x86 targets are built.
template <typename Src, typename Dst>
struct Implementations {
  using Fn = void (*)(const Src*, Dst*, int64_t);
  Fn avx512 = nullptr, avx2 = nullptr, portable = nullptr;
};

template <typename Src, typename Dst>
void runOn(HalfIsa isa, const Implementations<Src, Dst>& fns, const Src* src, Dst* dst, int64_t n) {
  if (isa == HalfIsa::Avx512F16c && fns.avx512 != nullptr) return fns.avx512(src, dst, n);
  if (isa == HalfIsa::Avx2F16c && fns.avx2 != nullptr) return fns.avx2(src, dst, n);
  fns.portable(src, dst, n);
}

#ifdef MESHFUSE_X86_TARGETS
#define MESHFUSE_X86_ONLY(fn) fn
#else
#define MESHFUSE_X86_ONLY(fn) nullptr
#endif
}  // namespace

void halfToFloatRun(HalfIsa isa, const uint16_t* src, float* dst, int64_t n) {
  runOn<uint16_t, float>(
      isa, {MESHFUSE_X86_ONLY(halfToFloatAvx512), MESHFUSE_X86_ONLY(halfToFloatAvx2), halfToFloatPortable}, src, dst,
      n);
}

void floatToHalfRun(HalfIsa isa, const float* src, uint16_t* dst, int64_t n) {
  runOn<float, uint16_t>(
      isa, {MESHFUSE_X86_ONLY(floatToHalfAvx512), MESHFUSE_X86_ONLY(floatToHalfAvx2), floatToHalfPortable}, src, dst,
      n);
}

void roundThroughHalfRun(HalfIsa isa, const float* src, float* dst, int64_t n) {
  runOn<float, float>(
      isa,
      {MESHFUSE_X86_ONLY(roundThroughHalfAvx512), MESHFUSE_X86_ONLY(roundThroughHalfAvx2), roundThroughHalfPortable},
      src, dst, n);
}

}  // namespace half_detail

namespace {
const half_detail::HalfIsa kHalfIsa = half_detail::bestHalfIsa();  // once, at load
}  // namespace

void halfToFloatRun(const uint16_t* src, float* dst, int64_t n) { half_detail::halfToFloatRun(kHalfIsa, src, dst, n); }

void floatToHalfRun(const float* src, uint16_t* dst, int64_t n) { half_detail::floatToHalfRun(kHalfIsa, src, dst, n); }

void roundThroughHalfRun(const float* src, float* dst, int64_t n) {
  half_detail::roundThroughHalfRun(kHalfIsa, src, dst, n);
}

MESHFUSE_SIMD_CLONES void bf16ToFloatRun(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16ToFloatSelect(src[i]);
}

MESHFUSE_SIMD_CLONES void floatToBf16Run(const float* __restrict src, uint16_t* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = floatToBf16Select(src[i]);
}

MESHFUSE_SIMD_CLONES void roundThroughBf16Run(const float* src, float* dst, int64_t n) {
  roundThrough(src, dst, n, [](float x) { return bf16ToFloatSelect(floatToBf16Select(x)); });
}

}  // namespace meshfuse::cpu

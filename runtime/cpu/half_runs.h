// Converting runs of IEEE float16 and bfloat16 to and from float32, vectorized.
//
// runtime/half.h converts one element with branches (subnormals, inf/NaN, overflow), which keeps
// the compiler from vectorizing any loop around it: Half and BFloat16 kernels spent most of their
// time there. Its functions stay the reference (and the form for single elements): everything here
// gives the same bits for every input (tests/cpp/test_cpu_half_runs.cpp).
//
// The element forms below compute every case and select the right one, so a loop over them
// vectorizes. They use integer operations and exact float operations only, so no MXCSR setting
// (rounding mode, FTZ, DAZ) changes them. The Half runs use F16C where the CPU has it (half_runs.cpp),
// with NaN lanes set as the reference sets them (F16C quiets signaling NaNs and keeps float->half
// payloads). BFloat16 has no such instruction to use: AVX512-BF16's flushes subnormals to zero.
#pragma once
#include <cstdint>
#include <cstring>

namespace meshfuse::cpu {

namespace half_detail {
[[gnu::always_inline]] inline uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
[[gnu::always_inline]] inline float floatOf(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
// c ? x : y through a mask. GCC 12 narrows a ?: whose result is stored as 16 bits to mixed-width
// operands and then gives up on the loop ("relevant stmt not supported"); a mask keeps it whole.
[[gnu::always_inline]] inline uint32_t select(bool c, uint32_t x, uint32_t y) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (x & mask) | (y & ~mask);
}
}  // namespace half_detail

// The element forms are always inlined: a SIMD clone (simd_clones.h) that calls them gets its own
// wide loop, where an out-of-line call would run the baseline code one element at a time.

[[gnu::always_inline]] inline float halfToFloatSelect(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = h & 0x7c00u, mant = h & 0x3ffu;
  // Normal: the exponent rebiased from 15 to 127, the mantissa moved to the top of float's.
  const uint32_t normal = (static_cast<uint32_t>(h & 0x7fffu) << 13) + 0x38000000u;
  // Inf and NaN: the payload kept bit for bit, as halfToFloat does (a signaling NaN stays one).
  const uint32_t special = (mant << 13) | 0x7f800000u;
  // Zero and subnormal: mant * 2^-24, exact in float (a normal result), so no rounding mode or
  // denormal flag can change it.
  const uint32_t tiny = half_detail::bitsOf(static_cast<float>(static_cast<int32_t>(mant)) * 0x1p-24f);
  const uint32_t magnitude = half_detail::select(exp == 0, tiny, half_detail::select(exp == 0x7c00u, special, normal));
  return half_detail::floatOf(sign | magnitude);
}

[[gnu::always_inline]] inline uint16_t floatToHalfSelect(float f) {
  const uint32_t bits = half_detail::bitsOf(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t a = bits & 0x7fffffffu;
  // Rounding to nearest even by adding just under half a unit of the kept last place, plus that
  // place's bit: a tie carries only from an odd value. A normal result keeps 10 of 23 bits.
  const uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
  // A subnormal result (|f| < 2^-14) is the 24-bit significand shifted right by 126 - exponent,
  // 14 to 24 there; clamped so that the lanes which take another result shift by a defined count
  // (25 gives 0 for everything below 2^-25, as the reference).
  const int32_t unclamped = 126 - static_cast<int32_t>(a >> 23);
  const int32_t shift = unclamped < 14 ? 14 : (unclamped > 25 ? 25 : unclamped);
  const uint32_t sig = (a & 0x7fffffu) | 0x800000u;
  const uint32_t tiny = (sig + ((1u << (shift - 1)) - 1u) + ((sig >> shift) & 1u)) >> shift;
  uint32_t r = half_detail::select(a < 0x38800000u, tiny, normal);
  r = half_detail::select(a >= 0x477ff000u, 0x7c00u, r);  // from 65520 (half way to 2^16) up: inf
  r = half_detail::select(a > 0x7f800000u, 0x7e00u, r);   // NaN: the quiet NaN, payload dropped (as floatToHalf)
  return static_cast<uint16_t>(sign | r);
}

[[gnu::always_inline]] inline float bf16ToFloatSelect(uint16_t h) {
  return half_detail::floatOf(static_cast<uint32_t>(h) << 16);
}

[[gnu::always_inline]] inline uint16_t floatToBf16Select(float f) {
  const uint32_t bits = half_detail::bitsOf(f);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;  // NaN stays NaN, quiet, its top payload kept
  return static_cast<uint16_t>(half_detail::select((bits & 0x7fffffffu) > 0x7f800000u, quiet_nan, rounded));
}

// dst[i] = src[i] converted, for i < n. Source and destination do not overlap. Half goes through
// F16C's vector conversions where the CPU has them (AVX-512 or AVX2), else through the forms above,
// built for AVX-512, AVX2 and the baseline (simd_clones.h); BFloat16 always through the forms above.
void halfToFloatRun(const uint16_t* src, float* dst, int64_t n);
void floatToHalfRun(const float* src, uint16_t* dst, int64_t n);
void bf16ToFloatRun(const uint16_t* src, float* dst, int64_t n);
void floatToBf16Run(const float* src, uint16_t* dst, int64_t n);

// dst[i] = src[i] rounded to Half (BFloat16) and read back: a cast inside a float computation.
// dst is src or does not overlap it.
void roundThroughHalfRun(const float* src, float* dst, int64_t n);
void roundThroughBf16Run(const float* src, float* dst, int64_t n);

// Each implementation of the Half runs by name, so that the tests check every one this CPU can run.
namespace half_detail {
enum class HalfIsa { Portable, Avx2F16c, Avx512F16c };
// The widest this CPU runs and this build has (Portable only where simd_clones.h builds no clones).
HalfIsa bestHalfIsa();
void halfToFloatRun(HalfIsa isa, const uint16_t* src, float* dst, int64_t n);
void floatToHalfRun(HalfIsa isa, const float* src, uint16_t* dst, int64_t n);
void roundThroughHalfRun(HalfIsa isa, const float* src, float* dst, int64_t n);
}  // namespace half_detail

}  // namespace meshfuse::cpu

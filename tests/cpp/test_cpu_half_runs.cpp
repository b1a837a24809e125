// The vectorized Half/BFloat16 run conversions (runtime/cpu/half_runs.h) against the scalar
// functions of runtime/half.h, bit for bit: every 16-bit pattern to float, and float to 16 bits on
// every value next to a rounding boundary, every exponent with NaN payloads, and random bits. The
// Half runs are checked in each implementation this CPU runs (F16C with AVX-512 or AVX2, and the
// portable one), and under MXCSR settings that would change a conversion that depended on them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>
#ifdef __x86_64__
#include <immintrin.h>
#endif

#include "runtime/cpu/half_runs.h"
#include "runtime/half.h"

namespace meshfuse {
namespace {

using cpu::bf16ToFloatRun;
using cpu::floatToBf16Run;
using cpu::half_detail::HalfIsa;

using ToFloatRun = std::function<void(const uint16_t*, float*, int64_t)>;
using FromFloatRun = std::function<void(const float*, uint16_t*, int64_t)>;

// The Half implementations this CPU runs, the portable one first.
std::vector<HalfIsa> halfIsas() {
  std::vector<HalfIsa> isas;
  for (HalfIsa isa : {HalfIsa::Portable, HalfIsa::Avx2F16c, HalfIsa::Avx512F16c})
    if (isa <= cpu::half_detail::bestHalfIsa()) isas.push_back(isa);
  return isas;
}

std::string nameOf(HalfIsa isa) {
  switch (isa) {
    case HalfIsa::Portable: return "portable";
    case HalfIsa::Avx2F16c: return "AVX2 F16C";
    case HalfIsa::Avx512F16c: return "AVX-512 F16C";
  }
  return "?";
}

ToFloatRun halfToFloatRun(HalfIsa isa) {
  return [isa](const uint16_t* src, float* dst, int64_t n) { cpu::half_detail::halfToFloatRun(isa, src, dst, n); };
}
FromFloatRun floatToHalfRun(HalfIsa isa) {
  return [isa](const float* src, uint16_t* dst, int64_t n) { cpu::half_detail::floatToHalfRun(isa, src, dst, n); };
}

uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

float floatOf(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

std::vector<uint16_t> all16BitPatterns() {
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

// Floats whose conversion is decided near a boundary: each 16-bit value of `to_float` exactly,
// the midpoint to the next one (a tie), and their neighbours a few ulps away, with both signs.
std::vector<float> boundaryFloats(float (*to_float)(uint16_t)) {
  std::vector<float> v;
  for (uint32_t h = 0; h < 0x7fff; ++h) {
    const float lo = to_float(static_cast<uint16_t>(h)), hi = to_float(static_cast<uint16_t>(h + 1));
    if (lo != lo || hi != hi) continue;  // NaN: covered by everyExponent
    // Past the largest finite value, the tie is half a step above it (where rounding overflows).
    const float step = std::isinf(hi) ? lo - to_float(static_cast<uint16_t>(h - 1)) : hi - lo;
    const float mid = lo + step / 2;  // exact: a 12 (Half) or 9 (BFloat16) bit significand
    for (const float x : {lo, mid})
      for (int d = -3; d <= 3; ++d) {
        const uint32_t b = bitsOf(x) + static_cast<uint32_t>(d);
        if (static_cast<int64_t>(bitsOf(x)) + d < 0) continue;
        v.push_back(floatOf(b));
        v.push_back(floatOf(b | 0x80000000u));
      }
  }
  return v;
}

// Every float exponent (zero, subnormals, inf, NaN included) with mantissas that end in each kind
// of rounding remainder for both 10- and 7-bit results, and with NaN payloads.
std::vector<float> everyExponent() {
  const uint32_t mantissas[] = {0,        1,        2,        0xfff,    0x1000,   0x1001,   0x1fff,
                                0x2000,   0x3000,   0x7fff,   0x8000,   0x8001,   0x10000,  0x18000,
                                0x200000, 0x3fffff, 0x400000, 0x400001, 0x7fe000, 0x7ff000, 0x7fffff};
  std::vector<float> v;
  for (uint32_t e = 0; e < 256; ++e)
    for (const uint32_t m : mantissas)
      for (const uint32_t s : {0u, 0x80000000u}) v.push_back(floatOf(s | (e << 23) | m));
  return v;
}

std::vector<float> randomFloats(size_t n) {
  std::mt19937 rng(20240607);
  std::vector<float> v(n);
  for (float& f : v) f = floatOf(static_cast<uint32_t>(rng()));
  return v;
}

void expectToFloatMatches(const std::string& what, const ToFloatRun& run, float (*reference)(uint16_t)) {
  const std::vector<uint16_t> in = all16BitPatterns();
  std::vector<float> out(in.size());
  run(in.data(), out.data(), static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(bitsOf(out[i]), bitsOf(reference(in[i]))) << what << " of 0x" << std::hex << in[i];
}

void expectFromFloatMatches(const std::string& what, const std::vector<float>& in, const FromFloatRun& run,
                            uint16_t (*reference)(float)) {
  std::vector<uint16_t> out(in.size());
  run(in.data(), out.data(), static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(out[i], reference(in[i])) << what << " of float 0x" << std::hex << bitsOf(in[i]);
}

TEST(CpuHalfRuns, EveryHalfPatternToFloat) {
  for (HalfIsa isa : halfIsas())
    expectToFloatMatches("halfToFloatRun, " + nameOf(isa), halfToFloatRun(isa), halfToFloat);
}

TEST(CpuHalfRuns, EveryBFloat16PatternToFloat) { expectToFloatMatches("bf16ToFloatRun", bf16ToFloatRun, bf16ToFloat); }

TEST(CpuHalfRuns, FloatToHalfAtBoundaries) {
  for (HalfIsa isa : halfIsas()) {
    const std::string what = "floatToHalfRun, " + nameOf(isa);
    expectFromFloatMatches(what, boundaryFloats(halfToFloat), floatToHalfRun(isa), floatToHalf);
    expectFromFloatMatches(what, boundaryFloats(bf16ToFloat), floatToHalfRun(isa), floatToHalf);
    expectFromFloatMatches(what, everyExponent(), floatToHalfRun(isa), floatToHalf);
  }
}

TEST(CpuHalfRuns, FloatToBFloat16AtBoundaries) {
  expectFromFloatMatches("floatToBf16Run", boundaryFloats(bf16ToFloat), floatToBf16Run, floatToBf16);
  expectFromFloatMatches("floatToBf16Run", boundaryFloats(halfToFloat), floatToBf16Run, floatToBf16);
  expectFromFloatMatches("floatToBf16Run", everyExponent(), floatToBf16Run, floatToBf16);
}

TEST(CpuHalfRuns, RandomFloats) {
  const std::vector<float> in = randomFloats(size_t{1} << 22);
  for (HalfIsa isa : halfIsas())
    expectFromFloatMatches("floatToHalfRun, " + nameOf(isa), in, floatToHalfRun(isa), floatToHalf);
  expectFromFloatMatches("floatToBf16Run", in, floatToBf16Run, floatToBf16);
}

// A float computation's cast to Half or BFloat16: the value rounded and read back, in place too.
TEST(CpuHalfRuns, RoundThroughMatchesScalarRoundTrip) {
  std::vector<float> in = everyExponent();
  const std::vector<float> more = boundaryFloats(halfToFloat);
  in.insert(in.end(), more.begin(), more.end());
  const auto n = static_cast<int64_t>(in.size());
  std::vector<float> bf16(in.size());
  cpu::roundThroughBf16Run(in.data(), bf16.data(), n);
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(bitsOf(bf16[i]), bitsOf(bf16ToFloat(floatToBf16(in[i])))) << "at float 0x" << std::hex << bitsOf(in[i]);
  for (HalfIsa isa : halfIsas()) {
    std::vector<float> half(in.size()), in_place = in;
    cpu::half_detail::roundThroughHalfRun(isa, in.data(), half.data(), n);
    cpu::half_detail::roundThroughHalfRun(isa, in_place.data(), in_place.data(), n);
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(bitsOf(half[i]), bitsOf(halfToFloat(floatToHalf(in[i]))))
          << nameOf(isa) << ", at float 0x" << std::hex << bitsOf(in[i]);
      ASSERT_EQ(bitsOf(in_place[i]), bitsOf(half[i])) << nameOf(isa) << ", in place, at " << i;
    }
  }
}

#ifdef __x86_64__
// Flush-to-zero, denormals-are-zero and rounding upward, for one scope: a conversion through the
// FPU's float arithmetic or an instruction that followed MXCSR would round or flush differently.
class ScopedMxcsr {
 public:
  explicit ScopedMxcsr(unsigned bits) : saved_(_mm_getcsr()) { _mm_setcsr((saved_ & ~_MM_ROUND_MASK) | bits); }
  ~ScopedMxcsr() { _mm_setcsr(saved_); }
  ScopedMxcsr(const ScopedMxcsr&) = delete;
  ScopedMxcsr& operator=(const ScopedMxcsr&) = delete;

 private:
  unsigned saved_;
};

TEST(CpuHalfRuns, IndependentOfMxcsr) {
  std::vector<float> in = everyExponent();
  for (float (*to_float)(uint16_t) : {halfToFloat, bf16ToFloat}) {
    const std::vector<float> more = boundaryFloats(to_float);
    in.insert(in.end(), more.begin(), more.end());
  }
  const unsigned kModes[] = {_MM_FLUSH_ZERO_ON | 0x0040u /* DAZ */ | _MM_ROUND_UP, _MM_ROUND_DOWN,
                             _MM_ROUND_TOWARD_ZERO | _MM_FLUSH_ZERO_ON};
  for (const unsigned mode : kModes) {
    const ScopedMxcsr scoped(mode);
    const std::string under = " under MXCSR bits 0x" + std::to_string(mode);
    for (HalfIsa isa : halfIsas()) {
      expectToFloatMatches("halfToFloatRun, " + nameOf(isa) + under, halfToFloatRun(isa), halfToFloat);
      expectFromFloatMatches("floatToHalfRun, " + nameOf(isa) + under, in, floatToHalfRun(isa), floatToHalf);
    }
    expectToFloatMatches("bf16ToFloatRun" + under, bf16ToFloatRun, bf16ToFloat);
    expectFromFloatMatches("floatToBf16Run" + under, in, floatToBf16Run, floatToBf16);
  }
}
#endif

// Lengths around the vector widths (4, 8, 16 lanes) and misaligned starts: the vector body, its
// remainder and the scalar epilogue all convert, and nothing past the run is written.
TEST(CpuHalfRuns, RunLengthsAndOffsets) {
  const std::vector<float> values = randomFloats(1100);
  const uint16_t kGuard16 = 0xabcd;
  const float kGuard = -1234.5f;
  for (HalfIsa isa : halfIsas())
    for (const int64_t n : {0, 1, 7, 15, 17, 31, 33, 1000})
      for (int64_t offset = 0; offset < 4; ++offset) {
        const std::string where = nameOf(isa) + ", n " + std::to_string(n) + ", offset " + std::to_string(offset);
        std::vector<uint16_t> half(1100, kGuard16), bf16(1100, kGuard16);
        floatToHalfRun(isa)(values.data() + offset, half.data() + offset, n);
        floatToBf16Run(values.data() + offset, bf16.data() + offset, n);
        std::vector<float> from_half(1100, kGuard), from_bf16(1100, kGuard), rounded(1100, kGuard);
        halfToFloatRun(isa)(half.data() + offset, from_half.data() + offset, n);
        bf16ToFloatRun(bf16.data() + offset, from_bf16.data() + offset, n);
        cpu::half_detail::roundThroughHalfRun(isa, values.data() + offset, rounded.data() + offset, n);
        for (int64_t i = 0; i < 1100; ++i) {
          const bool inside = i >= offset && i < offset + n;
          const float x = values[i];
          ASSERT_EQ(half[i], inside ? floatToHalf(x) : kGuard16) << where << ", at " << i;
          ASSERT_EQ(bf16[i], inside ? floatToBf16(x) : kGuard16) << where << ", at " << i;
          ASSERT_EQ(bitsOf(from_half[i]), bitsOf(inside ? halfToFloat(half[i]) : kGuard)) << where << ", at " << i;
          ASSERT_EQ(bitsOf(from_bf16[i]), bitsOf(inside ? bf16ToFloat(bf16[i]) : kGuard)) << where << ", at " << i;
          ASSERT_EQ(bitsOf(rounded[i]), bitsOf(inside ? halfToFloat(floatToHalf(x)) : kGuard)) << where << ", at " << i;
        }
      }
}

}  // namespace
}  // namespace meshfuse

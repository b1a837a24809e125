// Float e^x and tanh written so that GCC vectorizes loops over them (std::exp and std::tanh are
// libm calls per element, which no loop vectorizes without -ffast-math). Used by the pointwise,
// normalization and attention kernels.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace meshfuse::cpu {

// e^x in float without a libm call, so that loops over it vectorize: e^x = 2^k * e^r with
// k = round(x / ln 2) and |r| <= ln(2) / 2, e^r by its Taylor polynomial to degree 7 (truncation
// below 2^-26). Within 2 ulp of std::exp; inf, -inf, NaN, overflow and gradual underflow as std::exp.
inline float expFloat(float x) {
  const float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);  // e^-104 rounds to 0, e^89 to inf
  const float t = xc * 1.44269504088896341f;
  const float safe_t = t == t ? t : 0.0f;  // NaN: any k (r stays NaN)
  // Adding 1.5 * 2^23 rounds to an integer, which the low bits of the sum then hold (no float to int
  // conversion: it would keep the loop from vectorizing under trapping math).
  const float shifted = safe_t + 12582912.0f;
  const float kf = shifted - 12582912.0f;
  const float r = (xc - kf * 0.693145751953125f) - kf * 1.428606765330187045e-06f;  // ln 2 = hi + lo
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^k as two powers of two, each a normal float for k in [-150, 129].
  uint32_t shifted_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof shifted_bits);
  const int32_t k = static_cast<int32_t>(shifted_bits - 0x4B400000u);
  const int32_t k1 = k >> 1, k2 = k - k1;
  float s1, s2;
  const uint32_t b1 = static_cast<uint32_t>(k1 + 127) << 23, b2 = static_cast<uint32_t>(k2 + 127) << 23;
  std::memcpy(&s1, &b1, sizeof s1);
  std::memcpy(&s2, &b2, sizeof s2);
  return p * s1 * s2;
}

// tanh for float, vectorizable (std::tanh is a libm call per element): |x| * P(x^2) / Q(x^2), a
// rational fit of degrees 4 and 4 in x^2 on [0, 9] (scripts/fit-tanh.py: 2e-8 relative in float64,
// 3.6e-7 evaluated in float), and 1 from |x| = 9 on, where tanh rounds to 1 in float.
// Eight FMAs and a division: about a third of the time of the earlier (1 - e) / (1 + e) with
// e = e^-2|x| (an exp polynomial, its range reduction and a division). Within 1e-6 relative of
// std::tanh; NaN, +-inf and +-0 as std::tanh (-0 keeps its sign through a = -0).
inline float tanhFloat(float v) {
  const float a = v < 0.0f ? -v : v;
  const float c = a < 9.0f ? a : 9.0f;  // NaN becomes 9 here and is restored below
  const float y = c * c;
  const float p = (((1.33558204e-08f * y + 2.06099412e-05f) * y + 0.00349564129f) * y + 0.133810714f) * y + 1.0f;
  const float q = (((7.77703917e-07f * y + 0.000328572089f) * y + 0.0258771852f) * y + 0.467143863f) * y + 1.0f;
  const float t = c * p / q;
  const float below_one = t < 1.0f ? t : 1.0f;
  const float r = a < 9.0f ? below_one : 1.0f;  // from 9 on (inf and NaN too), tanh is 1 in float
  return v < 0.0f ? -r : (v == v ? r : v);
}

// e^x and tanh in a compute type T: the functions above for float, libm's otherwise. Always
// inlined, so that every SIMD clone of a loop over them gets its own wide copy.
template <typename T>
[[gnu::always_inline]] inline T expOf(T v) {
  if constexpr (std::is_same_v<T, float>)
    return expFloat(v);
  else
    return static_cast<T>(std::exp(v));
}

template <typename T>
[[gnu::always_inline]] inline T tanhOf(T v) {
  if constexpr (std::is_same_v<T, float>)
    return tanhFloat(v);
  else
    return static_cast<T>(std::tanh(v));
}

}  // namespace meshfuse::cpu

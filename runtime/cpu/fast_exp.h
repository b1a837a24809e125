// e^x for the softmax of the flash-attention kernel, written so that GCC vectorizes a loop over it
// (std::exp does not vectorize without -ffast-math). Arguments are <= 0 there (scores minus their
// running maximum); below -87 (and -inf, masked scores) the result is exactly 0. Error: about
// 1 ulp (Cody-Waite range reduction, degree-6 Taylor polynomial of e^r on |r| <= ln2/2).
#pragma once
#include <cstdint>
#include <cstring>

namespace meshfuse::cpu {

inline float expNonPositive(float x) {
  const bool underflow = !(x > -87.0f);  // also -inf and NaN-free masked entries
  const float xc = underflow ? -87.0f : x;
  constexpr float kShift = 0x1.8p23f;  // adding then subtracting rounds to an integer
  const float n = (xc * 1.44269504088896341f + kShift) - kShift;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;  // ln2 split hi + lo
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return underflow ? 0.0f : p * scale;
}

}  // namespace meshfuse::cpu

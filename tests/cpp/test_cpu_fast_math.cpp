// The CPU kernels' vectorizable float exp and tanh (runtime/cpu/fast_exp.h) against libm in
// double, over their whole range and at the special values, both as inline scalars and through
// applyUnary, whose loop is the SIMD clone this CPU runs (AVX-512 here: FMA-contracted).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "runtime/cpu/fast_exp.h"
#include "runtime/cpu/pointwise_math.h"

namespace meshfuse {
namespace {

// Distance in units in the last place of `expected` (rounded to float).
double ulps(float got, double expected) {
  const float e = static_cast<float>(expected);
  if (got == e) return 0;
  const float ulp = std::nextafter(std::fabs(e), std::numeric_limits<float>::infinity()) - std::fabs(e);
  return std::fabs(static_cast<double>(got) - expected) / static_cast<double>(ulp);
}

std::vector<float> sweep(float lo, float hi, int n) {
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n - 1);
  return x;
}

// op over x through applyUnary (the SIMD clone this CPU runs).
std::vector<float> applied(OpType op, const std::vector<float>& x) {
  std::vector<float> out(x.size());
  cpu::applyUnary<float>(op, x.data(), out.data(), static_cast<int64_t>(x.size()));
  return out;
}

TEST(CpuFastMath, ExpWithinTwoUlpOverItsRange) {
  const std::vector<float> x = sweep(-103.0f, 88.5f, 200001);
  const std::vector<float> vec = applied(OpType::Exp, x);
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = std::exp(static_cast<double>(x[i]));
    if (ref < std::numeric_limits<float>::min()) continue;  // subnormal results: checked below
    ASSERT_LE(ulps(cpu::expFloat(x[i]), ref), 2.0) << "scalar exp(" << x[i] << ")";
    ASSERT_LE(ulps(vec[i], ref), 2.0) << "vector exp(" << x[i] << ")";
  }
}

TEST(CpuFastMath, ExpSpecialValuesAndSubnormals) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(cpu::expFloat(-inf), 0.0f);
  EXPECT_EQ(cpu::expFloat(-200.0f), 0.0f);
  EXPECT_EQ(cpu::expFloat(inf), inf);
  EXPECT_EQ(cpu::expFloat(100.0f), inf);
  EXPECT_TRUE(std::isnan(cpu::expFloat(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(cpu::expFloat(0.0f), 1.0f);
  for (float x : sweep(-103.0f, -87.5f, 1001)) {  // gradual underflow: absolute error below 2^-149 * 2
    const double ref = std::exp(static_cast<double>(x));
    EXPECT_NEAR(cpu::expFloat(x), ref, 2 * 1.401298464324817e-45 + ref * 1e-6) << "exp(" << x << ")";
  }
}

TEST(CpuFastMath, TanhWithinOneMillionthOverItsRange) {
  const std::vector<float> x = sweep(-12.0f, 12.0f, 200001);
  const std::vector<float> vec = applied(OpType::Tanh, x);
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = std::tanh(static_cast<double>(x[i]));
    const double tol = 1e-6 * std::fabs(ref) + 1e-30;
    ASSERT_NEAR(cpu::tanhFloat(x[i]), ref, tol) << "scalar tanh(" << x[i] << ")";
    ASSERT_NEAR(vec[i], ref, tol) << "vector tanh(" << x[i] << ")";
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(cpu::tanhFloat(inf), 1.0f);
  EXPECT_EQ(cpu::tanhFloat(-inf), -1.0f);
  EXPECT_EQ(cpu::tanhFloat(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(cpu::tanhFloat(-0.0f)));
  EXPECT_TRUE(std::isnan(cpu::tanhFloat(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace meshfuse

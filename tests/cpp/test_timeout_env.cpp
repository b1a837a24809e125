// MESHFUSE_TIMEOUT as every wait reads it (multidevice/timeout_env.h): seconds with an optional "s",
// held to [1 ms, 100000 days] so that "inf" and 1e10 (which once expired at once: the deadline's
// nanoseconds overflowed) mean "very long"; anything else is an error naming the value.
#include <gtest/gtest.h>

#include <chrono>

#include "multidevice/timeout_env.h"
#include "scoped_env.h"

namespace meshfuse {
namespace {

using std::chrono::milliseconds;

TEST(TimeoutEnv, SecondsWithAnOptionalUnit) {
  testing::ScopedEnv env("MESHFUSE_TIMEOUT", "2.5");
  EXPECT_EQ(timeoutFromEnvironment().value, milliseconds(2500));
  testing::ScopedEnv unit("MESHFUSE_TIMEOUT", "7s");
  EXPECT_EQ(timeoutFromEnvironment().value, milliseconds(7000));
}

TEST(TimeoutEnv, HugeAndInfiniteAreTheLongestAndStayInTheFuture) {
  constexpr milliseconds kLongest{100000LL * 24 * 3600 * 1000};
  for (const char* value : {"inf", "1e10", "1e400"}) {
    testing::ScopedEnv env("MESHFUSE_TIMEOUT", value);
    const EnvTimeout t = timeoutFromEnvironment();
    ASSERT_TRUE(t.value.has_value()) << value;
    EXPECT_EQ(*t.value, kLongest) << value;
    EXPECT_GT(std::chrono::steady_clock::now() + *t.value, std::chrono::steady_clock::now()) << value;
  }
  testing::ScopedEnv tiny("MESHFUSE_TIMEOUT", "1e-9");
  EXPECT_EQ(timeoutFromEnvironment().value, milliseconds(1));
}

TEST(TimeoutEnv, NotAPositiveNumberIsAnErrorAndFallsBack) {
  for (const char* value : {"abc", "0", "-3", "nan", "5x", "60 s"}) {
    testing::ScopedEnv env("MESHFUSE_TIMEOUT", value);
    const EnvTimeout t = timeoutFromEnvironment();
    EXPECT_FALSE(t.value.has_value()) << value;
    EXPECT_NE(t.error.find(std::string("MESHFUSE_TIMEOUT=") + value + ": expected a positive number of seconds"),
              std::string::npos)
        << t.error;
    EXPECT_EQ(timeoutFromEnvironmentOr(milliseconds(42)), milliseconds(42)) << value;
  }
}

}  // namespace
}  // namespace meshfuse

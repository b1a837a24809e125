#include "multidevice/timeout_env.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>

namespace meshfuse {

EnvTimeout timeoutFromEnvironment() {
  const char* env = std::getenv("MESHFUSE_TIMEOUT");
  if (env == nullptr || *env == '\0') return {};
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  if (end != env && *end == 's') ++end;
  if (end == env || *end != '\0' || !(seconds > 0))  // NaN fails the comparison too
    return {std::nullopt,
            std::string("MESHFUSE_TIMEOUT=") + env + ": expected a positive number of seconds (e.g. 60, or inf)"};
  constexpr double kLongest = 100000.0 * 24 * 3600;  // seconds; 8.64e18 ns still fits in int64
  const double clamped = std::clamp(seconds, 0.001, kLongest);
  return {std::chrono::milliseconds(static_cast<int64_t>(std::llround(clamped * 1000))), ""};
}

std::chrono::milliseconds timeoutFromEnvironmentOr(std::chrono::milliseconds fallback) {
  return timeoutFromEnvironment().value.value_or(fallback);
}

}  // namespace meshfuse

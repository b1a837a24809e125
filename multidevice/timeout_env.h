// MESHFUSE_TIMEOUT, read one way by every wait that honours it (execute's communications, the world
// barrier, the backends' bootstraps and operations): seconds, a trailing "s" allowed, held to
// [1 ms, 100000 days]. "inf" (never, in practice) is the longest: a deadline much beyond it
// overflowed the clocks' nanosecond counts, and 1e10 s expired at once.
#pragma once
#include <chrono>
#include <optional>
#include <string>

namespace meshfuse {

struct EnvTimeout {
  std::optional<std::chrono::milliseconds> value;  // none: unset, or not valid (then `error` says why)
  std::string error;
};

EnvTimeout timeoutFromEnvironment();

// The environment's timeout, or `fallback` where it is unset or not valid (execute raises for the latter).
std::chrono::milliseconds timeoutFromEnvironmentOr(std::chrono::milliseconds fallback);

}  // namespace meshfuse

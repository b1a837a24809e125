// MESHFUSE_DEBUG logging, in the spirit of NCCL_DEBUG: INFO prints each newly lowered host program
// and each communication as it is posted; WARN prints warnings only; unset (or anything else)
// prints nothing. Every line goes to stderr prefixed "[meshfuse rank R]".
//
// The level is read from the environment once and cached in an atomic, so a disabled check on the
// hot path is one relaxed load and a branch; build messages only inside `if (debug::enabled(...))`.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>

namespace meshfuse::debug {

enum class Level : int { Off = 0, Warn = 1, Info = 2 };

namespace detail {
inline std::atomic<int> cached_level{-1};  // -1: MESHFUSE_DEBUG not read yet
int readLevelFromEnv();                    // parses MESHFUSE_DEBUG and stores it in cached_level
}  // namespace detail

inline Level level() {
  int v = detail::cached_level.load(std::memory_order_relaxed);
  if (v < 0) v = detail::readLevelFromEnv();
  return static_cast<Level>(v);
}
inline bool enabled(Level at) { return static_cast<int>(level()) >= static_cast<int>(at); }

// Overrides the environment (tests; a program that wants logging without setting the variable).
void setLevel(Level l);
// Parses a MESHFUSE_DEBUG value: "INFO", "WARN" (any case); anything else is Off.
Level parseLevel(const char* value);

// Writes `message` (each of its lines prefixed) to stderr in one write, if `at` is enabled.
void log(Level at, const std::string& message);
inline void info(const std::string& message) { log(Level::Info, message); }
inline void warn(const std::string& message) { log(Level::Warn, message); }

// "[meshfuse rank R] ": the world rank when MPI is initialized, else from the launcher's
// environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK), else 0. Never initializes MPI.
std::string prefix();

}  // namespace meshfuse::debug

// The polling loop behind every host-driven wait with a deadline (MPI requests, UCC requests):
// spins first (a small message completes in microseconds, and neither Open MPI's non-blocking
// collectives nor UCC progress outside the test call), then yields, then sleeps, so a rank waiting
// long for a late peer does not burn a core the peer may need.
#pragma once
#include <algorithm>
#include <chrono>
#include <thread>

namespace meshfuse {

// Calls done() until it returns true (then true) or `deadline` passes (false).
template <typename Done>
bool pollUntil(Done&& done, std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kSpin = std::chrono::microseconds(100);
  constexpr auto kYield = std::chrono::milliseconds(200);
  const auto start = Clock::now();
  auto nap = std::chrono::microseconds(20);
  while (true) {
    if (done()) return true;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    const auto waited = now - start;
    if (waited < kSpin) continue;
    if (waited < kYield) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(nap, deadline - now));
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace meshfuse

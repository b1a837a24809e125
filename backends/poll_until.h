// The polling loop behind every host-driven wait with a deadline (MPI requests, UCC requests):
// spins first (a small message completes in microseconds, and neither Open MPI's non-blocking
// collectives nor UCC progress outside the test call), then yields, then sleeps, so a rank waiting
// long for a late peer does not burn a core the peer may need.
// A wait that goes on sleeping asks every 100 ms whether the user interrupted it (wait_interrupt.h).
#pragma once
#include <algorithm>
#include <chrono>
#include <thread>

#include "backends/wait_interrupt.h"

namespace meshfuse {

// Calls done() until it returns true (then true) or `deadline` passes (false); throws
// WaitInterrupted on Ctrl-C once the wait has gone on past its spinning and yielding phases.
template <typename Done>
bool pollUntil(Done&& done, std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kSpin = std::chrono::microseconds(100);
  constexpr auto kYield = std::chrono::milliseconds(200);
  constexpr auto kInterruptEvery = std::chrono::milliseconds(100);
  const auto start = Clock::now();
  auto nap = std::chrono::microseconds(20);
  auto next_interrupt_check = start + kYield;
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
    if (now >= next_interrupt_check) {
      throwIfWaitInterrupted();
      next_interrupt_check = now + kInterruptEvery;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(nap, deadline - now));
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace meshfuse

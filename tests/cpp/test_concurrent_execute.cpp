// Several threads execute separate definitions at once, as the Python front end promises
// (FusionDefinition instances may execute from different threads; execute releases the GIL).
// Each thread lowers and runs its own seeded fuzz cases (pointwise, reductions, views, matmuls,
// casts, broadcasts; new programs and cached ones), so process-wide state (allocator accounting,
// kernel and plan caches, debug settings) is shared between them. Run under ThreadSanitizer by
// scripts/test --tsan, which reports any unsynchronized access.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "fuzz_runner.h"

namespace meshfuse {
namespace {

TEST(ConcurrentExecute, ThreadsRunSeparateFusionsAndEachMatchesTheReference) {
  constexpr int kThreads = 4;
  const uint64_t per_thread = testing::fuzzEnvOr("MESHFUSE_CONCURRENT_CASES", 150);
  std::atomic<int> failed{0}, matched{0};
  std::vector<std::string> first_failure(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < per_thread; ++i) {
        const uint64_t seed = 90000 + static_cast<uint64_t>(t) * per_thread + i;
        auto r = testing::runFuzzCase(seed, /*world_size=*/1, /*rank=*/0, /*strict=*/true, /*twice=*/i % 3 == 0);
        if (r.outcome == testing::FuzzOutcome::Matched) ++matched;
        if (r.outcome == testing::FuzzOutcome::Failed && failed++ == 0) first_failure[t] = r.detail;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (const std::string& f : first_failure)
    if (!f.empty()) ADD_FAILURE() << f;
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(matched.load(), static_cast<int>(kThreads * per_thread) / 2);
}

}  // namespace
}  // namespace meshfuse

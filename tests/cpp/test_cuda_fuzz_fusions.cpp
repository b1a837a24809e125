// Fuzzing on the GPU: the single-process fuzz cases (tests/cpp/fuzz_generator.h: random ops, shapes
// with broadcasting and symbolic extents, dtypes, shardings on a one-device mesh, a quarter with a
// deliberate mistake) with their inputs on CUDA device 0, so each runs through segmentation, the CUDA
// code generator, NVRTC, cuBLASLt and the normalization runner. A valid case must match the same
// float64 reference as on the CPU; a mutated one must raise UserError. Skipped without a GPU.
// MESHFUSE_FUZZ_SEED and MESHFUSE_FUZZ_CASES (default 600, about a minute on an H100) pick the seeds.
#include <gtest/gtest.h>

#if MESHFUSE_HAVE_CUDA
#include <cstdio>
#include <string>

#include "fuzz_runner.h"
#include "runtime/cuda/streams.h"

namespace meshfuse {
namespace {

using testing::FuzzOutcome;

TEST(CudaFuzzFusions, RandomCasesMatchTheReferenceOrRaiseUserError) {
  std::string why;
  if (cuda::deviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const uint64_t first = testing::fuzzEnvOr("MESHFUSE_FUZZ_SEED", 1000),
                 cases = testing::fuzzEnvOr("MESHFUSE_FUZZ_CASES", 600);
  int matched = 0, raised = 0, failed = 0;
  for (uint64_t seed = first; seed < first + cases; ++seed) {
    auto r = testing::runFuzzCase(seed, /*world_size=*/1, /*rank=*/0, /*strict=*/true, /*twice=*/seed % 10 == 0,
                                  Device::cuda(0));
    if (r.outcome == FuzzOutcome::Matched) ++matched;
    if (r.outcome == FuzzOutcome::RaisedUserError) ++raised;
    if (r.outcome == FuzzOutcome::Failed && ++failed <= 5) ADD_FAILURE() << r.detail;
    if (r.outcome == FuzzOutcome::Failed) {  // flushed: a run stopped by a time limit still lists its failures
      std::printf("FAIL %s\n", r.detail.substr(0, r.detail.find('\n')).c_str());
      std::fflush(stdout);
    }
  }
  std::printf("[ cuda fuzz: %d matched the reference, %d raised UserError (mutated), %d failed ]\n", matched, raised,
              failed);
  EXPECT_EQ(failed, 0);
  if (cases >= 100) EXPECT_GT(matched, static_cast<int>(cases) / 2) << "most cases are valid and must run";
}

}  // namespace
}  // namespace meshfuse
#endif

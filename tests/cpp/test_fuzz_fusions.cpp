// Fuzzing, single process: 10,000 seeded random small fusions (random ops, shapes with
// broadcasting and symbolic extents, dtypes, shardings on a one-device mesh), a quarter with a
// deliberate mistake. Each either runs and matches an independent float64 reference or raises
// UserError; none may crash, hang, mismatch or throw anything else.
// MESHFUSE_FUZZ_SEED and MESHFUSE_FUZZ_CASES replay other seeds (e.g. one failing case).
#include <gtest/gtest.h>

#include "fuzz_runner.h"
#include "ops/ops.h"

namespace meshfuse {
namespace {

using testing::FuzzOutcome;

TEST(FuzzFusions, TenThousandRandomCasesMatchTheReferenceOrRaiseUserError) {
  const uint64_t first = testing::fuzzEnvOr("MESHFUSE_FUZZ_SEED", 1000),
                 cases = testing::fuzzEnvOr("MESHFUSE_FUZZ_CASES", 10000);
  int matched = 0, raised = 0, failed = 0;
  for (uint64_t seed = first; seed < first + cases; ++seed) {
    auto r = testing::runFuzzCase(seed, /*world_size=*/1, /*rank=*/0, /*strict=*/true, /*twice=*/seed % 10 == 0);
    if (r.outcome == FuzzOutcome::Matched) ++matched;
    if (r.outcome == FuzzOutcome::RaisedUserError) ++raised;
    if (r.outcome == FuzzOutcome::Failed && ++failed <= 5) ADD_FAILURE() << r.detail;
    if (r.outcome == FuzzOutcome::Failed && std::getenv("MESHFUSE_FUZZ_LIST"))
      std::printf("FAIL %s\n", r.detail.substr(0, r.detail.find('\n')).c_str());
  }
  std::printf("[ fuzz: %d matched the reference, %d raised UserError (mutated), %d failed ]\n", matched, raised,
              failed);
  EXPECT_EQ(failed, 0);
  if (cases >= 100) EXPECT_GT(matched, static_cast<int>(cases) / 2) << "most cases are valid and must run";
}

// Found by the fuzzer (seeds 3773, 5610, 6649 and 2052): on a mesh of one device a sharding is the
// whole tensor, so any annotation of a reshape's result lines up with its input's blocks; it was
// rejected as one that does not ([2] sharded on axis 0 -> [2, 1] annotated sharded on axis 1).
TEST(FuzzFusions, ReshapeAnnotationOnAOneDeviceMeshAlwaysLinesUp) {
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {2});
  f->addInput(x);
  TensorView* y = ops::reshape(x, {2, 1});
  f->addOutput(y);
  for (auto [tv, axis] : {std::pair{x, 0}, std::pair{y, 1}}) {
    tv->setDeviceMesh(DeviceMesh({0}));
    tv->outerSplit(axis, 1);
    tv->parallelize(axis, ParallelType::MeshX);
  }
  Tensor in = Tensor::empty({2}, DataType::Float);
  in.dataAs<float>()[0] = 1.5f;
  in.dataAs<float>()[1] = -2.0f;
  auto out = FusionExecutorCache(f).execute({in});
  ASSERT_EQ(out[0].shape(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(out[0].item(0), 1.5);
  EXPECT_EQ(out[0].item(1), -2.0);
}

}  // namespace
}  // namespace meshfuse

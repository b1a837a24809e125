// Fuzzing across ranks: every rank builds the same seeded random fusion with random shardings over
// the world mesh (a quarter with a deliberate mistake: uneven splits, mismatched extents, bad
// axes, meshes beyond the world, wrong inputs) and executes it with its own shards. Each case
// must run and match the float64 reference on every rank, or (mutated) raise UserError on every rank;
// ranks must agree on which, and none may crash or hang (ctest's timeout bounds the run).
#include <gtest/gtest.h>
#include <mpi.h>

#include "fuzz_runner.h"
#include "mp_test_utils.h"
#include "multidevice/communicator.h"
#include "ops/ops.h"
#if MESHFUSE_HAVE_CUDA
#include "runtime/cuda/streams.h"
#endif

namespace meshfuse {
namespace {

using testing::FuzzOutcome;

// Runs `default_cases` seeds from `default_first` (MESHFUSE_FUZZ_SEED / MESHFUSE_FUZZ_CASES override
// both) with inputs on `device` and judges them on every rank.
void fuzzAcrossRanks(uint64_t default_first, uint64_t default_cases, Device device,
                     const MultiDeviceExecutorParams& params, const char* label) {
  Communicator& comm = Communicator::instance();
  const uint64_t first = testing::fuzzEnvOr("MESHFUSE_FUZZ_SEED", default_first),
                 cases = testing::fuzzEnvOr("MESHFUSE_FUZZ_CASES", default_cases);
  int matched = 0, raised = 0, failed = 0, disagreed = 0;
  for (uint64_t seed = first; seed < first + cases; ++seed) {
    // Strict: every generated sharding is on the world mesh and divides evenly, so a valid case
    // that raises UserError is a bug (the symbolic broadcast operand was one).
    auto r =
        testing::runFuzzCase(seed, comm.size(), comm.rank(), /*strict=*/true, /*twice=*/seed % 10 == 0, device, params);
    // Every rank must reach the same verdict: a rank that ran while another raised means a
    // collective was left unmatched (caught by the timeout) or a check is rank-dependent.
    int mine = static_cast<int>(r.outcome), lo = 0, hi = 0;
    MPI_Allreduce(&mine, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (lo != hi && ++disagreed <= 3)
      ADD_FAILURE() << "seed " << seed << ": ranks disagree on the outcome; rank " << comm.rank() << ": "
                    << (r.detail.empty() ? "matched" : r.detail);
    if (r.outcome == FuzzOutcome::Matched) ++matched;
    if (r.outcome == FuzzOutcome::RaisedUserError) ++raised;
    if (r.outcome == FuzzOutcome::Failed && ++failed <= 5) ADD_FAILURE() << "rank " << comm.rank() << ": " << r.detail;
    if (r.outcome == FuzzOutcome::Failed && comm.rank() == 0 && std::getenv("MESHFUSE_FUZZ_LIST"))
      std::printf("FAIL %s\n", r.detail.substr(0, r.detail.find('\n')).c_str());
  }
  if (comm.rank() == 0)
    std::printf("[ %s, %lld ranks: %d matched, %d raised UserError (mutated), %d failed ]\n", label,
                static_cast<long long>(comm.size()), matched, raised, failed);
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(disagreed, 0);
  if (cases >= 100) EXPECT_GT(matched, static_cast<int>(cases) / 3) << "most valid cases must run";
}

TEST(FuzzMultiDevice, RandomShardedCasesMatchOrRaiseUserErrorOnEveryRank) {
  fuzzAcrossRanks(5000, 1500, Device::cpu(), {}, "multi-device fuzz");
}

#if MESHFUSE_HAVE_CUDA
// The same on CUDA tensors, every rank on the one GPU of the GPU machine (device = local rank modulo
// the devices), through the MPI backend, which stages device tensors through the host (NCCL takes
// one rank per GPU). Skipped without a GPU.
TEST(CudaFuzzMultiDevice, RandomShardedCasesOnCudaTensorsMatchOrRaiseUserErrorOnEveryRank) {
  std::string why;
  const int gpus = cuda::deviceCount(&why);
  if (gpus == 0) GTEST_SKIP() << "no CUDA device: " << why;
  MultiDeviceExecutorParams params;
  params.lower.communicator_backend = CommunicatorBackend::Mpi;
  const Device device = Device::cuda(static_cast<int>(Communicator::instance().localRank() % gpus));
  fuzzAcrossRanks(5000, 300, device, params, "multi-device CUDA fuzz (MPI)");
}
#endif

// Found by the fuzzer: a reshape whose output is sharded along its leading axis while the input's
// leading extent (1) does not divide by the mesh size was lowered to a local reshape of mismatched
// sizes. Now the reshape runs on the replicated input and each rank keeps its slice.
TEST(FuzzMultiDevice, ReshapeIntoShardedLeadingAxis) {
  Communicator& comm = Communicator::instance();
  const int64_t n = comm.size();
  std::vector<int64_t> devices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) devices[static_cast<size_t>(i)] = i;
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {1, 2 * n});
  f->addInput(x);
  TensorView* y = ops::reshape(x, {n, 2});
  f->addOutput(y);
  x->setDeviceMesh(DeviceMesh(devices));
  y->setDeviceMesh(DeviceMesh(devices));
  y->outerSplit(0, n);
  y->parallelize(0, ParallelType::MeshX);
  Tensor full = Tensor::empty({1, 2 * n}, DataType::Float);
  for (int64_t i = 0; i < 2 * n; ++i) full.dataAs<float>()[i] = static_cast<float>(i);
  auto out = FusionExecutorCache(f).execute({full});
  ASSERT_EQ(out[0].shape(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(out[0].item(0), static_cast<double>(2 * comm.rank()));
  EXPECT_EQ(out[0].item(1), static_cast<double>(2 * comm.rank() + 1));
}

// The same with the sharded output axis not the leading one: [2, 3n] -> [2, n, 3] sharded on the
// middle axis, which no input axis maps to.
TEST(FuzzMultiDevice, ReshapeIntoShardedInnerAxis) {
  Communicator& comm = Communicator::instance();
  const int64_t n = comm.size();
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {2, 3 * n});
  f->addInput(x);
  TensorView* y = ops::reshape(x, {2, n, 3});
  f->addOutput(y);
  x->setDeviceMesh(testing::worldMesh());
  y->setDeviceMesh(testing::worldMesh());
  y->outerSplit(1, n);
  y->parallelize(1, ParallelType::MeshX);
  Tensor full = testing::randomTensor({2, 3 * n}, 77);
  auto out = FusionExecutorCache(f).execute({full});
  ASSERT_EQ(out[0].shape(), (std::vector<int64_t>{2, 1, 3}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t k = 0; k < 3; ++k)
      EXPECT_EQ(out[0].item(i * 3 + k), full.item(i * 3 * n + comm.rank() * 3 + k)) << i << "," << k;
}

// Found by the fuzzer: an operand axis defined symbolic (-1) that binds to 1 broadcasts along an
// output axis sharded over the mesh. Resharding judged "size 1" by the definition's -1, asked for
// the operand sharded along an axis of 1, and rejected the valid fusion; the operand is replicated.
TEST(FuzzMultiDevice, SymbolicSizeOneOperandBroadcastsAlongShardedAxis) {
  Communicator& comm = Communicator::instance();
  const int64_t n = comm.size(), rank = comm.rank();
  auto f = std::make_shared<Fusion>();
  TensorView* a = f->newTensor(DataType::Float, {-1, 3});  // bound to [1, 3]
  TensorView* b = f->newTensor(DataType::Float, {2 * n, 3});
  f->addInput(a);
  f->addInput(b);
  TensorView* y = ops::binary(OpType::Add, a, b);
  f->addOutput(y);
  for (TensorView* tv : {a, b, y}) tv->setDeviceMesh(testing::worldMesh());
  for (TensorView* tv : {b, y}) {
    tv->outerSplit(0, n);
    tv->parallelize(0, ParallelType::MeshX);
  }
  Tensor a_full = testing::randomTensor({1, 3}, 81), b_full = testing::randomTensor({2 * n, 3}, 82);
  auto out = FusionExecutorCache(f).execute({a_full, testing::shardOf(b_full, 0, n, rank)});
  ASSERT_EQ(out[0].shape(), (std::vector<int64_t>{2, 3}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t k = 0; k < 3; ++k)
      EXPECT_EQ(out[0].item(i * 3 + k),
                static_cast<float>(a_full.item(k)) + static_cast<float>(b_full.item((2 * rank + i) * 3 + k)))
          << i << "," << k;
}

// The same through broadcast_in_dim: x [-1, 1] bound to [1, 1] expands to [2n, 1, 4], sharded on
// the axis the symbolic extent expands.
TEST(FuzzMultiDevice, SymbolicSizeOneAxisExpandsIntoShardedAxis) {
  Communicator& comm = Communicator::instance();
  const int64_t n = comm.size();
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {-1, 1});
  f->addInput(x);
  TensorView* y = ops::broadcastInDim(x, {2 * n, 1, 4}, {0, 1});
  f->addOutput(y);
  x->setDeviceMesh(testing::worldMesh());
  y->setDeviceMesh(testing::worldMesh());
  y->outerSplit(0, n);
  y->parallelize(0, ParallelType::MeshX);
  Tensor full = testing::randomTensor({1, 1}, 83);
  auto out = FusionExecutorCache(f).execute({full});
  ASSERT_EQ(out[0].shape(), (std::vector<int64_t>{2, 1, 4}));
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(out[0].item(i), full.item(0)) << i;
}

// Found by the fuzzer (seeds 5102, 6372): extent-1 axes in front of a sharded axis made a reshape
// group start at them, so [1, 2n, 1] sharded on axis 1 -> [n, 2] sharded on axis 0, whose blocks
// line up, was rejected as an annotation that does not line up. It now stays local.
TEST(FuzzMultiDevice, ReshapeSkipsExtentOneAxesBeforeAShardedAxis) {
  Communicator& comm = Communicator::instance();
  const int64_t n = comm.size(), rank = comm.rank();
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {1, 2 * n, 1});
  f->addInput(x);
  TensorView* y = ops::reshape(x, {n, 2});
  f->addOutput(y);
  for (auto [tv, axis] : {std::pair{x, 1}, std::pair{y, 0}}) {
    tv->setDeviceMesh(testing::worldMesh());
    tv->outerSplit(axis, n);
    tv->parallelize(axis, ParallelType::MeshX);
  }
  Tensor full = testing::randomTensor({1, 2 * n, 1}, 84);
  FusionExecutorCache fec(f);
  auto out = fec.execute({testing::shardOf(full, 1, n, rank)});
  ASSERT_EQ(out[0].shape(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(out[0].item(0), full.item(2 * rank));
  EXPECT_EQ(out[0].item(1), full.item(2 * rank + 1));
}

}  // namespace
}  // namespace meshfuse

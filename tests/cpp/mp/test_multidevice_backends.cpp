// The communication backend chosen per execution (MultiDeviceExecutorParams.lower): every
// communication of the lowered program carries it (backend=... in the host IR), the same fusion
// gives the same result on MPI and on Gloo, two caches with different backends interleave in one
// process, and a backend this build lacks is a UserError naming those it has. Then one fusion per
// communication type of DESIGN.md's table, run on every host backend and checked on every rank
// against float64 references computed from the seeded global data.
#include <gtest/gtest.h>

#include <functional>
#include <sstream>

#include "host_ir/fusion_executor.h"
#include "mp_test_utils.h"
#include "multidevice/communicator.h"
#include "ops/ops.h"

namespace meshfuse {
namespace {

using testing::expectClose;
using testing::linearReference;
using testing::randomTensor;
using testing::shardOf;
using testing::worldMesh;

const std::vector<CommunicatorBackend> kHostBackends = testing::hostBackends();

MultiDeviceExecutorParams on(CommunicatorBackend backend) {
  MultiDeviceExecutorParams params;
  params.lower.communicator_backend = backend;
  return params;
}

int64_t worldSize() { return Communicator::instance().size(); }
int64_t myRank() { return Communicator::instance().rank(); }

// Splits logical `axis` of an unsplit tensor into mesh.size() parts along mesh_x.
void shardAlong(TensorView* tv, int64_t axis, const DeviceMesh& mesh) {
  tv->setDeviceMesh(mesh);
  tv->outerSplit(axis, mesh.size());
  tv->parallelize(axis, ParallelType::MeshX);
}

// The host IR's communication lines (those naming a team).
std::vector<std::string> communicationLines(const std::string& host_ir) {
  std::vector<std::string> lines;
  std::istringstream in(host_ir);
  for (std::string line; std::getline(in, line);)
    if (line.find("team=") != std::string::npos) lines.push_back(line);
  return lines;
}

void expectEveryCommunicationOn(const std::string& host_ir, CommunicatorBackend backend) {
  const auto lines = communicationLines(host_ir);
  EXPECT_FALSE(lines.empty()) << "no communication in\n" << host_ir;
  const std::string mark = "backend=" + toString(backend);
  for (const std::string& line : lines) EXPECT_NE(line.find(mark), std::string::npos) << line;
}

// ---- one fusion, two backends ----

// x [s, k] sharded along the sequence, w1 column-parallel, w2 row-parallel, y back along the
// sequence: an allgather before the first linear and a reduce-scatter after the second.
struct SequenceParallel {
  int64_t n = worldSize(), s = 4 * worldSize(), k = 5, hidden = 3 * worldSize();
  std::shared_ptr<Fusion> fusion = std::make_shared<Fusion>();
  Tensor x = randomTensor({s, k}, 201), w1 = randomTensor({hidden, k}, 202), w2 = randomTensor({k, hidden}, 203);

  SequenceParallel() {
    TensorView* tx = fusion->newTensor(DataType::Float, {s, k});
    TensorView* tw1 = fusion->newTensor(DataType::Float, {hidden, k});
    TensorView* tw2 = fusion->newTensor(DataType::Float, {k, hidden});
    for (TensorView* t : {tx, tw1, tw2}) fusion->addInput(t);
    TensorView* h = ops::linear(tx, tw1);
    TensorView* y = ops::linear(h, tw2);
    fusion->addOutput(y);
    const DeviceMesh mesh = worldMesh();
    shardAlong(tx, 0, mesh);
    shardAlong(tw1, 0, mesh);
    shardAlong(h, 1, mesh);
    shardAlong(tw2, 1, mesh);
    shardAlong(y, 0, mesh);
  }
  std::vector<Argument> inputs() const {
    return {shardOf(x, 0, n, myRank()), shardOf(w1, 0, n, myRank()), shardOf(w2, 1, n, myRank())};
  }
  Tensor expected() const { return shardOf(linearReference(linearReference(x, w1), w2), 0, n, myRank()); }
};

TEST(CommunicatorBackendChoice, EveryCommunicationUsesTheRequestedBackend) {
  SequenceParallel sp;
  std::vector<Tensor> results;
  for (CommunicatorBackend backend : kHostBackends) {
    FusionExecutorCache fec(sp.fusion);
    auto out = fec.execute(sp.inputs(), on(backend));
    const std::string hir = fec.lastHostIr();
    expectEveryCommunicationOn(hir, backend);
    EXPECT_NE(hir.find("Allgather"), std::string::npos) << hir;
    EXPECT_NE(hir.find("ReduceScatter"), std::string::npos) << hir;
    expectClose(out[0], sp.expected(), 1e-4, "sequence-parallel linear on " + toString(backend));
    results.push_back(out[0]);
  }
  // The backends move the same bytes and reduce in float32: their results agree closely.
  for (size_t i = 1; i < results.size(); ++i)
    expectClose(results[i], results[0].to(DataType::Double), 1e-5, "backends agree");
}

TEST(CommunicatorBackendChoice, TwoCachesWithDifferentBackendsInterleave) {
  if (kHostBackends.size() < 2) GTEST_SKIP() << "needs Gloo next to MPI";
  SequenceParallel sp;
  FusionExecutorCache on_mpi(sp.fusion), on_gloo(sp.fusion);
  for (int round = 0; round < 3; ++round) {
    auto a = on_mpi.execute(sp.inputs(), on(CommunicatorBackend::Mpi));
    auto b = on_gloo.execute(sp.inputs(), on(CommunicatorBackend::Gloo));
    expectClose(a[0], sp.expected(), 1e-4, "mpi, round " + std::to_string(round));
    expectClose(b[0], sp.expected(), 1e-4, "gloo, round " + std::to_string(round));
  }
  expectEveryCommunicationOn(on_mpi.lastHostIr(), CommunicatorBackend::Mpi);
  expectEveryCommunicationOn(on_gloo.lastHostIr(), CommunicatorBackend::Gloo);
  EXPECT_EQ(on_mpi.numCachedPrograms(), 1u);  // a repeated execute does not lower again
  EXPECT_EQ(on_gloo.numCachedPrograms(), 1u);
}

TEST(CommunicatorBackendChoice, OneCacheSwitchesBackendBetweenExecutions) {
  SequenceParallel sp;
  FusionExecutorCache fec(sp.fusion);
  for (CommunicatorBackend backend : kHostBackends) {
    auto out = fec.execute(sp.inputs(), on(backend));
    expectEveryCommunicationOn(fec.lastHostIr(), backend);
    expectClose(out[0], sp.expected(), 1e-4, "after switching to " + toString(backend));
  }
  EXPECT_EQ(fec.numCachedPrograms(), kHostBackends.size());  // one program per backend
}

TEST(CommunicatorBackendChoice, BackendNotBuiltIsAUserErrorListingTheAvailableOnes) {
  SequenceParallel sp;
  std::string available;
  for (CommunicatorBackend b : Communicator::instance().availableBackends())
    available += (available.empty() ? "" : ", ") + toString(b);
  bool tested = false;
  for (CommunicatorBackend missing : {CommunicatorBackend::Ucc, CommunicatorBackend::Nccl}) {
    if (Communicator::instance().isAvailable(missing)) continue;  // NCCL in a CUDA build, UCC where found
    tested = true;
    FusionExecutorCache fec(sp.fusion);
    try {
      fec.execute(sp.inputs(), on(missing));
      ADD_FAILURE() << toString(missing) << ": expected a UserError";
    } catch (const UserError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + toString(missing) + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("available: " + available), std::string::npos) << msg;
    }
    // Nothing was communicated, so the cache still runs on a backend that exists.
    auto out = fec.execute(sp.inputs(), on(CommunicatorBackend::Mpi));
    expectClose(out[0], sp.expected(), 1e-4, "after asking for " + toString(missing));
  }
  if (!tested) GTEST_SKIP() << "UCC and NCCL are both built here";
}

// ---- every communication type on every host backend ----

// One fusion, this rank's inputs and this rank's expected outputs (undefined where an output does
// not live on this rank), and the communication its lowering must contain.
struct Built {
  std::shared_ptr<Fusion> fusion = std::make_shared<Fusion>();
  std::vector<Argument> inputs;
  std::vector<Tensor> expected;
  double tolerance = 0;
  bool communicates = true;  // false: this rank is in no team (its host program is empty)
};

struct CommunicationCase {
  const char* name;
  const char* communication;  // as the host IR prints it
  std::function<Built(int64_t n, int64_t rank)> build;
};

// Sum of `full` [rows, cols] over axis 0 (columns) or 1 (rows), in float64.
Tensor sumOver(const Tensor& full, int axis) {
  const int64_t rows = full.size(0), cols = full.size(1);
  Tensor out = Tensor::zeros({axis == 0 ? cols : rows}, DataType::Double);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out.dataAs<double>()[axis == 0 ? j : i] += full.item(i * cols + j);
  return out;
}

// x sharded along `from` (or on one device when from < 0) -> set -> y as `shard_y` says.
Built resharded(int64_t n, int64_t rank, std::vector<int64_t> shape, int64_t from, const DeviceMesh& x_mesh,
                std::function<void(TensorView*)> shard_y, std::function<Tensor(const Tensor&)> expect, uint64_t seed,
                DataType dtype = DataType::Float) {
  Built b;
  TensorView* x = b.fusion->newTensor(dtype, shape);
  b.fusion->addInput(x);
  TensorView* y = ops::set(x);
  b.fusion->addOutput(y);
  if (from >= 0)
    shardAlong(x, from, x_mesh);
  else
    x->setDeviceMesh(x_mesh);
  shard_y(y);
  Tensor full = randomTensor(shape, seed, dtype);
  b.inputs = {x_mesh.has(rank) ? Argument(from >= 0 ? shardOf(full, static_cast<int>(from), n, rank) : full)
                               : Argument()};
  b.expected = {expect(full)};
  return b;
}

std::vector<CommunicationCase> communicationCases() {
  return {
      {"Allgather", "Allgather",
       [](int64_t n, int64_t rank) {
         return resharded(
             n, rank, {3, 2 * n}, 1, worldMesh(), [](TensorView* y) { y->setDeviceMesh(worldMesh()); },
             [](const Tensor& full) { return full; }, 301);
       }},
      {"Allreduce", "Allreduce",
       [](int64_t n, int64_t rank) {
         Built b;
         TensorView* x = b.fusion->newTensor(DataType::Double, {3 * n, 4});
         b.fusion->addInput(x);
         TensorView* s = ops::reduction(OpType::Sum, x, {0}, false);
         b.fusion->addOutput(s);
         shardAlong(x, 0, worldMesh());
         s->setDeviceMesh(worldMesh());
         Tensor full = randomTensor({3 * n, 4}, 302, DataType::Double);
         b.inputs = {shardOf(full, 0, n, rank)};
         b.expected = {sumOver(full, 0)};
         b.tolerance = 1e-12;
         return b;
       }},
      {"ReduceScatter", "ReduceScatter",
       [](int64_t n, int64_t rank) {
         Built b;
         const int64_t m = 2 * n, k = 3 * n, cols = 4;
         TensorView* x = b.fusion->newTensor(DataType::Float, {m, k});
         TensorView* w = b.fusion->newTensor(DataType::Float, {cols, k});
         b.fusion->addInput(x);
         b.fusion->addInput(w);
         TensorView* y = ops::linear(x, w);  // partial sums over the sharded k
         b.fusion->addOutput(y);
         shardAlong(x, 1, worldMesh());
         shardAlong(w, 1, worldMesh());
         shardAlong(y, 0, worldMesh());
         Tensor xf = randomTensor({m, k}, 303), wf = randomTensor({cols, k}, 304);
         b.inputs = {shardOf(xf, 1, n, rank), shardOf(wf, 1, n, rank)};
         b.expected = {shardOf(linearReference(xf, wf), 0, n, rank)};
         b.tolerance = 1e-4;
         return b;
       }},
      {"ReduceToOneDevice", "Reduce(",
       [](int64_t n, int64_t rank) {
         Built b;
         TensorView* x = b.fusion->newTensor(DataType::Float, {4, 2 * n});
         b.fusion->addInput(x);
         TensorView* s = ops::reduction(OpType::Sum, x, {1}, false);
         b.fusion->addOutput(s);
         shardAlong(x, 1, worldMesh());
         const int64_t root = n / 2;  // not team rank 0
         s->setDeviceMesh(DeviceMesh({root}));
         Tensor full = randomTensor({4, 2 * n}, 305);
         b.inputs = {shardOf(full, 1, n, rank)};
         b.expected = {rank == root ? sumOver(full, 1) : Tensor()};
         b.tolerance = 1e-5;
         return b;
       }},
      {"GatherToOneDevice", "Gather(",
       [](int64_t n, int64_t rank) {
         const int64_t root = n - 1;
         return resharded(
             n, rank, {2, 3 * n}, 1, worldMesh(), [root](TensorView* y) { y->setDeviceMesh(DeviceMesh({root})); },
             [=](const Tensor& full) { return rank == root ? full : Tensor(); }, 306);
       }},
      {"BroadcastFromOneDevice", "Broadcast",
       [](int64_t n, int64_t rank) {
         return resharded(
             n, rank, {3, 5}, -1, DeviceMesh({n - 1}), [](TensorView* y) { y->setDeviceMesh(worldMesh()); },
             [](const Tensor& full) { return full; }, 307, DataType::Double);
       }},
      {"ScatterFromOneDevice", "Scatter",
       [](int64_t n, int64_t rank) {
         return resharded(
             n, rank, {2, 2 * n}, -1, DeviceMesh({n - 1}), [](TensorView* y) { shardAlong(y, 1, worldMesh()); },
             [=](const Tensor& full) { return shardOf(full, 1, n, rank); }, 308);
       }},
      {"AllToAll", "AllToAll",
       [](int64_t n, int64_t rank) {
         return resharded(
             n, rank, {2 * n, n, 3}, 1, worldMesh(), [](TensorView* y) { shardAlong(y, 0, worldMesh()); },
             [=](const Tensor& full) { return shardOf(full, 0, n, rank); }, 309);
       }},
      {"SendRecvBetweenStages", "SendRecv",
       [](int64_t n, int64_t rank) {
         Built b;
         const int64_t first = 0, last = n - 1;
         TensorView* x = b.fusion->newTensor(DataType::Float, {3, 4});
         b.fusion->addInput(x);
         TensorView* h = ops::unary(OpType::Abs, x);
         TensorView* y = ops::binary(OpType::Add, h, b.fusion->newScalar(DataType::Double, 1.0));
         b.fusion->addOutput(y);
         x->setDeviceMesh(DeviceMesh({first}));
         h->setDeviceMesh(DeviceMesh({first}));
         y->setDeviceMesh(DeviceMesh({last}));
         Tensor full = randomTensor({3, 4}, 310);
         Tensor expected = Tensor::empty({3, 4}, DataType::Double);
         for (int64_t i = 0; i < 12; ++i) expected.dataAs<double>()[i] = std::abs(full.item(i)) + 1.0;
         b.inputs = {rank == first ? Argument(full) : Argument()};
         b.expected = {rank == last ? expected : Tensor()};
         b.tolerance = 1e-6;
         b.communicates = rank == first || rank == last;
         return b;
       }},
  };
}

class EveryCommunication : public ::testing::TestWithParam<std::tuple<CommunicatorBackend, size_t>> {};

TEST_P(EveryCommunication, MatchesTheReferenceOnEveryRank) {
  const auto [backend, index] = GetParam();
  const CommunicationCase c = communicationCases()[index];
  Built b = c.build(worldSize(), myRank());
  FusionExecutorCache fec(b.fusion);
  auto out = fec.execute(b.inputs, on(backend));
  const std::string hir = fec.lastHostIr();
  // On one process every mesh has one device: each resharding is a local copy (no team, no backend).
  if (b.communicates && worldSize() > 1) {
    EXPECT_NE(hir.find(c.communication), std::string::npos) << c.name << " lowered without " << c.communication << ":\n"
                                                            << hir;
    expectEveryCommunicationOn(hir, backend);
  } else {
    EXPECT_TRUE(communicationLines(hir).empty()) << hir;
  }
  ASSERT_EQ(out.size(), b.expected.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const std::string what = std::string(c.name) + " on " + toString(backend) + ", output " + std::to_string(i);
    if (!b.expected[i].defined()) {
      EXPECT_FALSE(out[i].defined()) << what << ": this rank should hold no part of it";
      continue;
    }
    expectClose(out[i], b.expected[i], b.tolerance, what);
  }
}

INSTANTIATE_TEST_SUITE_P(HostBackends, EveryCommunication,
                         ::testing::Combine(::testing::ValuesIn(kHostBackends),
                                            ::testing::Range<size_t>(0, communicationCases().size())),
                         [](const ::testing::TestParamInfo<std::tuple<CommunicatorBackend, size_t>>& info) {
                           return toString(std::get<0>(info.param)) + "_" +
                                  communicationCases()[std::get<1>(info.param)].name;
                         });

}  // namespace
}  // namespace meshfuse

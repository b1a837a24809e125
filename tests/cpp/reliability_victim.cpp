// A small multi-device program for the reliability ctest entries (tests/CMakeLists.txt): every
// rank allgathers a sharded tensor through FusionExecutorCache, except that rank 2 (the victim,
// or the last rank in a smaller world) misbehaves as `argv[1]` says:
//   ok        nobody misbehaves; exits 0 after checking the result
//   exit      _exit(1) before execute            sigkill  SIGKILL itself before execute
//   throw     an uncaught exception before execute (std::terminate)
//   hang      stays alive but never calls execute (the others must time out and abort the job)
//   hang2     takes part in a first execute, then never calls the second
//   mismatch  defines a different program (execute's agreement must fail on every rank)
//   coll_hang takes part in a first execute, then stays out of an allreduce the others post on the
//             backend directly (no input agreement before it: the backend's own wait must time out)
//   coll_kill the same, but SIGKILLs itself instead of joining the allreduce
// argv[2] names the communicator backend (mpi, gloo, ucc; default: auto).
// With MESHFUSE_ABORT_ON_TIMEOUT=0 a rank that times out catches CommunicationTimeout, prints it
// and returns 4 (its exit must not hang in MPI_Finalize waiting for the missing rank).
// Run under mpirun with MESHFUSE_TIMEOUT small: the job must end non-zero within bounded time.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "host_ir/fusion_executor.h"
#include "host_ir/timeout_policy.h"
#include "multidevice/communicator.h"
#include "ops/ops.h"

using namespace meshfuse;

namespace {

std::shared_ptr<Fusion> allgatherFusion(int64_t n, bool relu_instead) {
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {2 * n, 3});
  f->addInput(x);
  TensorView* y = relu_instead ? ops::unary(OpType::Relu, x) : ops::set(x);
  f->addOutput(y);
  std::vector<int64_t> devices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) devices[static_cast<size_t>(i)] = i;
  DeviceMesh world(devices);
  x->setDeviceMesh(world);
  x->outerSplit(0, n);
  x->parallelize(0, ParallelType::MeshX);
  y->setDeviceMesh(world);
  return f;
}

// This rank's shard: rows 2r, 2r+1 of a [2n, 3] tensor whose element (i, j) is i * 3 + j.
Tensor shard(int64_t rank) {
  Tensor t = Tensor::empty({2, 3}, DataType::Float);
  for (int64_t i = 0; i < 6; ++i) t.dataAs<float>()[i] = static_cast<float>(rank * 6 + i);
  return t;
}

bool checkGathered(const Tensor& y, int64_t n) {
  if (!y.defined() || y.numel() != 6 * n) return false;
  for (int64_t i = 0; i < 6 * n; ++i)
    if (y.item(i) != static_cast<double>(i)) return false;
  return true;
}

CommunicatorBackend backendNamed(const std::string& name) {
  for (CommunicatorBackend b : {CommunicatorBackend::Mpi, CommunicatorBackend::Gloo, CommunicatorBackend::Ucc,
                                CommunicatorBackend::Nccl, CommunicatorBackend::Cuda})
    if (toString(b) == name) return b;
  return CommunicatorBackend::Auto;
}

// Every rank but the victim allreduces on the backend itself; the victim hangs or dies instead.
int collectiveWithoutTheVictim(CommunicatorBackend type, int64_t n, bool me, const std::string& mode) {
  std::vector<int64_t> world(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) world[static_cast<size_t>(i)] = i;
  Backend& backend = Communicator::instance().backend(type, world);
  if (me) {
    std::printf("rank %lld: staying out of the allreduce\n", static_cast<long long>(backend.rankInTeam()));
    if (mode == "coll_kill") std::raise(SIGKILL);
    sleep(600);
    return 0;
  }
  Tensor t = Tensor::zeros({1024}, DataType::Float);
  auto work = backend.allreduce(t, ReduceOp::Sum);
  withTimeoutPolicy("in a direct allreduce", [&] { work->wait(std::chrono::seconds(5)); });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  MultiDeviceExecutorParams params;
  params.lower.communicator_backend = backendNamed(argc > 2 ? argv[2] : "auto");
  Communicator& comm = Communicator::instance();
  const int64_t rank = comm.rank(), n = comm.size();
  const int64_t victim = std::min<int64_t>(2, n - 1);
  const bool me = rank == victim;
  std::setvbuf(stdout, nullptr, _IONBF, 0);

  try {
    FusionExecutorCache fec(allgatherFusion(n, me && mode == "mismatch"));
    if (mode == "hang2" || mode.rfind("coll_", 0) == 0) {
      if (!checkGathered(fec.execute({shard(rank)}, params)[0], n)) return 2;
      std::printf("rank %lld: first execute done\n", static_cast<long long>(rank));
    }
    if (mode.rfind("coll_", 0) == 0) return collectiveWithoutTheVictim(params.lower.communicator_backend, n, me, mode);
    if (me) {
      if (mode == "exit") std::_Exit(1);
      if (mode == "sigkill") std::raise(SIGKILL);
      if (mode == "throw") throw std::runtime_error("the victim raised before execute");
      if (mode == "hang" || mode == "hang2") {
        std::printf("rank %lld: hanging instead of executing\n", static_cast<long long>(rank));
        sleep(600);
        return 0;
      }
    }
    bool ok = checkGathered(fec.execute({shard(rank)}, params)[0], n);
    std::printf("rank %lld: execute %s\n", static_cast<long long>(rank), ok ? "matched" : "MISMATCHED");
    return ok ? 0 : 2;
  } catch (const CommunicationTimeout& e) {
    std::printf("rank %lld: caught CommunicationTimeout: %s\n", static_cast<long long>(rank), e.what());
    return 4;
  } catch (const UserError& e) {
    std::printf("rank %lld: UserError: %s\n", static_cast<long long>(rank), e.what());
    return 3;
  }
}

// allgather, allreduce and reduce-scatter through meshfuse's MpiBackend (non-blocking MPI call,
// Work, polled wait) and, when built, its GlooBackend (worker thread, Work on a future) against
// the same collective called directly and blocking on MPI_COMM_WORLD, in the same run. Float32,
// 1 KiB .. 64 MiB in x4 steps; size is the full buffer (allgather output, allreduce buffer,
// reduce-scatter input), as nccl-tests counts it.
//   mpirun --oversubscribe --allow-run-as-root -np 2 build-mpi/benchmarks/bench_collectives [max MiB, default 64]
//   [--mpi-only]
// Rank 0 prints one table. Each (size, op) alternates rounds of meshfuse-mpi, meshfuse-gloo and
// raw; a round's time is the slowest rank's mean over its iterations, and the table shows the
// median round. benchmarks/collectives_torch.py times torch.distributed's gloo the same way.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "multidevice/communicator.h"

using namespace meshfuse;

namespace {

constexpr int kRounds = 7;
constexpr auto kTimeout = std::chrono::seconds(120);

// Mean seconds per call of `f` over `iters` calls, the slowest rank's.
double timeOnce(const std::function<void()>& f, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  double slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Row {
  int64_t bytes;
  const char* op;
  double meshfuse_s, gloo_s, raw_s, bus_factor;  // gloo_s < 0: no Gloo in this build
};

// `gloo` may be empty (a build without Gloo).
Row measure(int64_t bytes, const char* op, double bus_factor, const std::function<void()>& meshfuse,
            const std::function<void()>& gloo, const std::function<void()>& raw) {
  const int iters = static_cast<int>(std::clamp<int64_t>((int64_t{256} << 20) / bytes, 5, 2000));
  for (int i = 0; i < 3; ++i) {  // warm up every path (connections, pages, MPI's algorithm caches)
    meshfuse();
    if (gloo) gloo();
    raw();
  }
  std::vector<double> mf, gl, rw;
  for (int r = 0; r < kRounds; ++r) {
    mf.push_back(timeOnce(meshfuse, iters));
    if (gloo) gl.push_back(timeOnce(gloo, iters));
    rw.push_back(timeOnce(raw, iters));
  }
  return {bytes, op, median(mf), gloo ? median(gl) : -1.0, median(rw), bus_factor};
}

void printHeader(int64_t ranks) {
  std::printf("bench_collectives: %lld ranks, float32, median of %d rounds (slowest rank per round)\n",
              static_cast<long long>(ranks), kRounds);
  std::printf("%10s  %-14s  %12s  %12s  %12s  %13s  %13s  %13s  %7s  %9s\n", "size", "op", "meshfuse_us", "gloo_us",
              "raw_us", "mf_busbw_GB/s", "gloo_busbw", "raw_busbw_GB/s", "ratio", "added_us");
}

// Printed as soon as measured (flushed), so a run cut short still shows what it measured.
void printRow(const Row& r) {
  const double size = static_cast<double>(r.bytes);
  char label[32];
  if (r.bytes >= (1 << 20))
    std::snprintf(label, sizeof label, "%lld MiB", static_cast<long long>(r.bytes >> 20));
  else
    std::snprintf(label, sizeof label, "%lld KiB", static_cast<long long>(r.bytes >> 10));
  // The gloo columns read "n/a" in a build without Gloo.
  char gloo_us[32] = "n/a", gloo_bw[32] = "n/a";
  if (r.gloo_s > 0) {
    std::snprintf(gloo_us, sizeof gloo_us, "%.2f", r.gloo_s * 1e6);
    std::snprintf(gloo_bw, sizeof gloo_bw, "%.3f", size / r.gloo_s * r.bus_factor / 1e9);
  }
  std::printf("%10s  %-14s  %12.2f  %12s  %12.2f  %13.3f  %13s  %13.3f  %7.3f  %9.2f\n", label, r.op,
              r.meshfuse_s * 1e6, gloo_us, r.raw_s * 1e6, size / r.meshfuse_s * r.bus_factor / 1e9, gloo_bw,
              size / r.raw_s * r.bus_factor / 1e9, r.meshfuse_s / r.raw_s, (r.meshfuse_s - r.raw_s) * 1e6);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Communicator& comm = Communicator::instance();
  const int64_t n = comm.size();
  std::vector<int64_t> world(static_cast<size_t>(n));
  std::iota(world.begin(), world.end(), 0);
  Backend& mpi = comm.backend(CommunicatorBackend::Mpi, world);

  const double ring = static_cast<double>(n - 1) / static_cast<double>(n);

  // Arguments: the largest size in MiB (default 64); --mpi-only leaves Gloo out.
  int64_t max_bytes = int64_t{64} << 20;
  bool with_gloo = true;
  for (int a = 1; a < argc; ++a) {
    if (std::string(argv[a]) == "--mpi-only")
      with_gloo = false;
    else
      max_bytes = std::atoll(argv[a]) << 20;
  }
  Backend* gloo = with_gloo && comm.isAvailable(CommunicatorBackend::Gloo)
                      ? &comm.backend(CommunicatorBackend::Gloo, world)
                      : nullptr;
  const bool printer = comm.rank() == 0;
  if (printer) printHeader(n);
  auto report = [&](const Row& row) {
    if (printer) printRow(row);
  };
  for (int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    const int64_t block = bytes / 4 / n;  // floats per rank's block
    const int count = static_cast<int>(block);
    Tensor full = Tensor::zeros({block * n}, DataType::Float);
    Tensor part = Tensor::zeros({block}, DataType::Float);
    std::fill_n(full.dataAs<float>(), full.numel(), 1.0f);
    std::fill_n(part.dataAs<float>(), part.numel(), 1.0f);
    Tensor full_raw = full.clone(), part_raw = part.clone();
    Tensor full_gloo = full.clone(), part_gloo = part.clone();
    // An empty function where Gloo is not built: measure() then skips the column.
    auto onGloo = [&](std::function<void()> f) { return gloo ? f : std::function<void()>(); };

    report(measure(
        bytes, "allgather", ring, [&] { mpi.allgather(part, full)->wait(kTimeout); },
        onGloo([&] { gloo->allgather(part_gloo, full_gloo)->wait(kTimeout); }),
        [&] { MPI_Allgather(part_raw.data(), count, MPI_FLOAT, full_raw.data(), count, MPI_FLOAT, MPI_COMM_WORLD); }));
    report(measure(
        bytes, "allreduce", 2 * ring, [&] { mpi.allreduce(full, ReduceOp::Sum)->wait(kTimeout); },
        onGloo([&] { gloo->allreduce(full_gloo, ReduceOp::Sum)->wait(kTimeout); }),
        [&] {
          MPI_Allreduce(MPI_IN_PLACE, full_raw.data(), count * static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }));
    report(measure(
        bytes, "reduce_scatter", ring, [&] { mpi.reduceScatter(full, part, ReduceOp::Sum)->wait(kTimeout); },
        onGloo([&] { gloo->reduceScatter(full_gloo, part_gloo, ReduceOp::Sum)->wait(kTimeout); }),
        [&] {
          MPI_Reduce_scatter_block(full_raw.data(), part_raw.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }));
  }

  return 0;
}

// allgather, allreduce and reduce-scatter through meshfuse's backends against the same collective
// called directly and blocking, in the same run: MpiBackend (non-blocking MPI call, Work, polled
// wait) against MPI on MPI_COMM_WORLD; UccBackend (non-blocking UCC collective, Work progressing
// the context) against raw UCC (ucc_collective_init/post, progress + test until done, finalize, as
// ucc_perftest does) on a UCC team of the world in the same context; GlooBackend (worker thread,
// Work on a future) beside them. Float32, 1 KiB .. 256 MiB in x4 steps; size is the full buffer
// (allgather output, allreduce buffer, reduce-scatter input), as nccl-tests counts it.
//   mpirun --oversubscribe --allow-run-as-root -np 2 build/benchmarks/bench_collectives [max MiB, default 256]
//   [--mpi-only]
// Rank 0 prints one table. Each (size, op) alternates rounds of every path; a round's time is the
// slowest rank's mean over its iterations, and the table shows the median round.
// benchmarks/collectives_torch.py times torch.distributed's gloo the same way.
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
#if MESHFUSE_HAVE_UCC
#include <ucc/api/ucc.h>

#include <cstring>

#include "backends/ucc/ucc_context.h"
#include "backends/ucc/ucc_team.h"
#endif

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

// One way of running a collective (a column of the table); `run` is empty where not available.
struct Path {
  const char* name;
  std::function<void()> run;
};

struct Row {
  int64_t bytes;
  const char* op;
  double bus_factor;
  std::vector<double> seconds;  // per path, < 0: not run
};

// Per path, iterations enough for about 50 ms a round (from one timed call, the slowest rank's,
// so every rank runs the same count), at least 3 and at most 2000.
Row measure(int64_t bytes, const char* op, double bus_factor, const std::vector<Path>& paths) {
  std::vector<int> iters(paths.size(), 0);
  for (size_t i = 0; i < paths.size(); ++i) {
    if (!paths[i].run) continue;
    for (int w = 0; w < 2; ++w) paths[i].run();  // warm up (connections, pages, algorithm caches)
    iters[i] = static_cast<int>(std::clamp(0.05 / timeOnce(paths[i].run, 1), 3.0, 2000.0));
  }
  std::vector<std::vector<double>> times(paths.size());
  for (int r = 0; r < kRounds; ++r)
    for (size_t i = 0; i < paths.size(); ++i)
      if (paths[i].run) times[i].push_back(timeOnce(paths[i].run, iters[i]));
  Row row{bytes, op, bus_factor, {}};
  for (const auto& t : times) row.seconds.push_back(t.empty() ? -1.0 : median(t));
  return row;
}

// Paths 0/1 are meshfuse-mpi/raw-mpi, 2/3 meshfuse-ucc/raw-ucc, 4 meshfuse-gloo.
void printHeader(int64_t ranks, const std::vector<Path>& paths) {
  std::printf("bench_collectives: %lld ranks, float32, median of %d rounds (slowest rank per round); us per call\n",
              static_cast<long long>(ranks), kRounds);
  std::printf("%10s  %-14s", "size", "op");
  for (const Path& p : paths) std::printf("  %11s", p.name);
  std::printf("  %9s  %9s  %10s  %10s\n", "mpi_ratio", "ucc_ratio", "ucc_busbw", "rawucc_bw");
}

// Printed as soon as measured (flushed), so a run cut short still shows what it measured.
void printRow(const Row& r) {
  const double size = static_cast<double>(r.bytes);
  char label[32];
  if (r.bytes >= (1 << 20))
    std::snprintf(label, sizeof label, "%lld MiB", static_cast<long long>(r.bytes >> 20));
  else
    std::snprintf(label, sizeof label, "%lld KiB", static_cast<long long>(r.bytes >> 10));
  std::printf("%10s  %-14s", label, r.op);
  for (double t : r.seconds)
    if (t > 0)
      std::printf("  %11.2f", t * 1e6);
    else
      std::printf("  %11s", "n/a");
  auto ratio = [&](size_t a, size_t b) {
    return r.seconds[a] > 0 && r.seconds[b] > 0 ? r.seconds[a] / r.seconds[b] : 0;
  };
  auto busbw = [&](size_t a) { return r.seconds[a] > 0 ? size / r.seconds[a] * r.bus_factor / 1e9 : 0; };
  std::printf("  %9.3f  %9.3f  %10.3f  %10.3f\n", ratio(0, 1), ratio(2, 3), busbw(2), busbw(3));
  std::fflush(stdout);
}

// Every path computes the collective before it is timed: buffers filled with rank + 1, one call,
// then the result checked on every rank (the allgather's block r holds r + 1, a sum holds
// n (n + 1) / 2). A wrong result stops the benchmark (exit 1) before any number is printed for it.
bool verified(const char* op, const std::vector<Path>& paths, std::vector<Tensor>& fulls, std::vector<Tensor>& parts,
              int64_t rank, int64_t n) {
  const int64_t block = parts[0].numel();
  const auto sum = static_cast<float>(n * (n + 1) / 2);
  const std::string kind = op;
  bool ok = true;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (!paths[i].run) continue;
    std::fill_n(fulls[i].dataAs<float>(), block * n, static_cast<float>(rank + 1));
    std::fill_n(parts[i].dataAs<float>(), block, static_cast<float>(rank + 1));
    paths[i].run();
    const float* full = fulls[i].dataAs<float>();
    const float* part = parts[i].dataAs<float>();
    bool mine = true;
    if (kind == "reduce_scatter")
      mine = std::all_of(part, part + block, [&](float v) { return v == sum; });
    else if (kind == "allreduce")
      mine = std::all_of(full, full + block * n, [&](float v) { return v == sum; });
    else
      for (int64_t j = 0; j < block * n && mine; ++j) mine = full[j] == static_cast<float>(j / block + 1);
    int all = mine ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all == 0 && rank == 0)
      std::fprintf(stderr, "bench_collectives: %s through %s gave a wrong result (%lld floats a rank)\n", op,
                   paths[i].name, static_cast<long long>(block));
    ok = ok && all != 0;
    std::fill_n(fulls[i].dataAs<float>(), block * n, 1.0f);  // as the timed rounds start
    std::fill_n(parts[i].dataAs<float>(), block, 1.0f);
  }
  return ok;
}

#if MESHFUSE_HAVE_UCC
// A raw UCC collective on `team`, blocking: what the UCC backend's Work does, minus meshfuse.
void rawUcc(ucc_team_h team, ucc_coll_args_t args) {
  ucc_coll_req_h request = nullptr;
  ucc::check(ucc_collective_init(&args, &request, team), "ucc_collective_init");
  ucc::check(ucc_collective_post(request), "ucc_collective_post");
  ucc::Context& context = ucc::Context::instance();
  ucc_status_t status;
  do {
    context.progress();
    status = ucc_collective_test(request);
  } while (status == UCC_INPROGRESS);
  ucc::check(status, "ucc_collective_test");
  ucc_collective_finalize(request);
}

ucc_coll_args_t uccArgs(ucc_coll_type_t type, void* src, uint64_t src_count, void* dst, uint64_t dst_count) {
  ucc_coll_args_t args;
  std::memset(&args, 0, sizeof args);
  args.coll_type = type;
  args.op = UCC_OP_SUM;
  if (src) {
    args.src.info = {src, src_count, UCC_DT_FLOAT32, UCC_MEMORY_TYPE_HOST};
  } else {
    args.mask = UCC_COLL_ARGS_FIELD_FLAGS;
    args.flags = UCC_COLL_ARGS_FLAG_IN_PLACE;
  }
  args.dst.info = {dst, dst_count, UCC_DT_FLOAT32, UCC_MEMORY_TYPE_HOST};
  return args;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Communicator& comm = Communicator::instance();
  const int64_t n = comm.size();
  std::vector<int64_t> world(static_cast<size_t>(n));
  std::iota(world.begin(), world.end(), 0);
  Backend& mpi = comm.backend(CommunicatorBackend::Mpi, world);

  const double ring = static_cast<double>(n - 1) / static_cast<double>(n);

  // Arguments: the largest size in MiB (default 256); --mpi-only leaves Gloo and UCC out.
  int64_t max_bytes = int64_t{256} << 20;
  bool others = true;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    char* end = nullptr;
    const long long mib = std::strtoll(arg.c_str(), &end, 10);
    if (arg == "--mpi-only") {
      others = false;
    } else if (!arg.empty() && *end == '\0' && mib >= 1 && mib <= (int64_t{1} << 20)) {
      max_bytes = static_cast<int64_t>(mib) << 20;
    } else {  // anything else was taken as a size of 0: no output, exit 0
      const bool help = arg == "--help" || arg == "-h";
      if (comm.rank() == 0)
        std::fprintf(stderr, "usage: mpirun -np N %s [MAX_MIB (a whole number from 1, default 256)] [--mpi-only]\n%s\n",
                     argv[0], help ? "" : ("unknown argument: " + arg).c_str());
      return help ? 0 : 2;
    }
  }
  auto backendIfBuilt = [&](CommunicatorBackend type) {
    return others && comm.isAvailable(type) ? &comm.backend(type, world) : nullptr;
  };
  Backend* gloo = backendIfBuilt(CommunicatorBackend::Gloo);
  Backend* ucc = backendIfBuilt(CommunicatorBackend::Ucc);
#if MESHFUSE_HAVE_UCC
  // Raw UCC's own team of the world, in the process's UCC context (created by the backend above).
  std::unique_ptr<ucc::Team> raw_team = ucc ? std::make_unique<ucc::Team>(comm, world, comm.rank(), kTimeout) : nullptr;
#endif
  const bool printer = comm.rank() == 0;
  bool header = false;
  for (int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    const int64_t block = bytes / 4 / n;  // floats per rank's block
    const int count = static_cast<int>(block);
    // Every path its own buffers, all ones.
    std::vector<Tensor> fulls, parts;
    for (int i = 0; i < 5; ++i) {
      fulls.push_back(Tensor::zeros({block * n}, DataType::Float));
      parts.push_back(Tensor::zeros({block}, DataType::Float));
      std::fill_n(fulls.back().dataAs<float>(), block * n, 1.0f);
      std::fill_n(parts.back().dataAs<float>(), block, 1.0f);
    }
    // A path that runs only where `backend` (or raw UCC) is there.
    auto when = [](bool there, std::function<void()> f) { return there ? f : std::function<void()>(); };
    const bool raw_ucc = ucc != nullptr;
    auto row = [&](const char* op, double factor, std::function<void(Backend&, Tensor&, Tensor&)> through,
                   std::function<void()> raw_mpi, std::function<void()> raw_ucc_call) {
      std::vector<Path> paths = {
          {"mf_mpi", [&] { through(mpi, fulls[0], parts[0]); }},
          {"raw_mpi", raw_mpi},
          {"mf_ucc", when(ucc, [&] { through(*ucc, fulls[2], parts[2]); })},
          {"raw_ucc", when(raw_ucc, raw_ucc_call)},
          {"mf_gloo", when(gloo, [&] { through(*gloo, fulls[4], parts[4]); })},
      };
      if (!verified(op, paths, fulls, parts, comm.rank(), n)) std::exit(1);
      if (printer && !header) printHeader(n, paths);
      header = true;
      Row r = measure(bytes, op, factor, paths);
      if (printer) printRow(r);
    };
#if MESHFUSE_HAVE_UCC
    auto rawUccCall = [&](ucc_coll_args_t args) {
      return std::function<void()>([&, args] { rawUcc(raw_team->handle(), args); });
    };
    const uint64_t total = static_cast<uint64_t>(block * n), mine = static_cast<uint64_t>(block);
    std::function<void()> ucc_allgather =
        raw_ucc ? rawUccCall(uccArgs(UCC_COLL_TYPE_ALLGATHER, parts[3].data(), mine, fulls[3].data(), total)) : nullptr;
    std::function<void()> ucc_allreduce =
        raw_ucc ? rawUccCall(uccArgs(UCC_COLL_TYPE_ALLREDUCE, nullptr, 0, fulls[3].data(), total)) : nullptr;
    std::function<void()> ucc_reduce_scatter =
        raw_ucc ? rawUccCall(uccArgs(UCC_COLL_TYPE_REDUCE_SCATTER, fulls[3].data(), total, parts[3].data(), mine))
                : nullptr;
#else
    std::function<void()> ucc_allgather, ucc_allreduce, ucc_reduce_scatter;
#endif
    Tensor& full_raw = fulls[1];
    Tensor& part_raw = parts[1];
    row(
        "allgather", ring,
        [](Backend& b, Tensor& full, const Tensor& part) { b.allgather(part, full)->wait(kTimeout); },
        [&] { MPI_Allgather(part_raw.data(), count, MPI_FLOAT, full_raw.data(), count, MPI_FLOAT, MPI_COMM_WORLD); },
        ucc_allgather);
    row(
        "allreduce", 2 * ring,
        [](Backend& b, Tensor& full, Tensor&) { b.allreduce(full, ReduceOp::Sum)->wait(kTimeout); },
        [&] {
          MPI_Allreduce(MPI_IN_PLACE, full_raw.data(), count * static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        },
        ucc_allreduce);
    row(
        "reduce_scatter", ring,
        [](Backend& b, Tensor& full, Tensor& part) { b.reduceScatter(full, part, ReduceOp::Sum)->wait(kTimeout); },
        [&] { MPI_Reduce_scatter_block(full_raw.data(), part_raw.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
        ucc_reduce_scatter);
  }

  return 0;
}

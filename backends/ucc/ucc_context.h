// The process's one UCC library and context, never destroyed (teams are destroyed at exit before
// MPI_Finalize; the context's transports go with the process).
//
// The context is created with an out-of-band allgather over the whole world, collectively:
// Communicator::prepare(ucc) does it (the executor calls it once the ranks agree on a new program),
// or the first UCC team when that team is the world. Without a context-wide exchange UCC would
// connect every team's endpoints asking UCX for peer-failure handling, which UCX's shared-memory
// transports (sysv, posix) do not have: UCX then picks TCP over loopback, measured 5-10x slower for
// small messages here. A process whose first UCC team is a sub-team before any prepare() gets such
// a local context (correct, slower), with a warning.
//
// Progress: UCC moves data only inside ucc_context_progress, so Works call progress() from test()
// and wait(). MESHFUSE_UCC_PROGRESS_THREAD=1 adds a thread that progresses the context while any
// Work is in flight (and makes the context thread-safe, UCC_THREAD_MULTIPLE); off by default, see
// BENCHMARKS.md (UCC section) for the measurement behind that choice.
#pragma once
#include <ucc/api/ucc.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace meshfuse {
class Communicator;
}

namespace meshfuse::ucc {

// Throws std::runtime_error "`what` failed: <UCC's message>" unless status is UCC_OK.
void check(ucc_status_t status, const char* what);

class Context {
 public:
  // Collective over the world: creates the context with the world's address exchange, unless it
  // exists. Throws CommunicationTimeout when a rank does not come within `timeout`.
  static void createForWorld(Communicator& communicator, std::chrono::milliseconds timeout);
  // The context a new team of `team` (world ranks) is made in; creates it as the header says.
  static Context& forTeam(Communicator& communicator, const std::vector<int64_t>& team,
                          std::chrono::milliseconds timeout);
  // The context (a team has been made, so it exists).
  static Context& instance();

  ucc_context_h handle() const { return context_; }
  // One step of every posted operation of every team.
  void progress() { ucc_context_progress(context_); }
  // Works in flight (the progress thread runs only while there are some).
  void started();
  void finished();
  bool hasProgressThread() const { return thread_.joinable(); }

 private:
  // `world`: null for a local context (no OOB).
  Context(Communicator* world, std::chrono::milliseconds timeout);
  void runProgressThread();

  ucc_lib_h lib_ = nullptr;
  ucc_context_h context_ = nullptr;
  std::mutex mutex_;
  std::condition_variable busy_;
  int64_t in_flight_ = 0;
  std::thread thread_;
};

}  // namespace meshfuse::ucc

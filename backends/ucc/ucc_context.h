// The process's one UCC library and context, created on first use (by the first UCC team) and
// never destroyed (teams are destroyed at exit before MPI_Finalize; the context's transports go
// with the process).
//
// The context is created without an out-of-band allgather: a context-wide exchange would be
// collective over the whole world, but the Communicator creates a backend collectively over its
// team only (the first UCC team may be a sub-team, whose non-members never come). UCC then
// exchanges addresses per team, at team creation, over the team's own OOB (ucc_team.h).
//
// Progress: UCC moves data only inside ucc_context_progress, so Works call progress() from test()
// and wait(). MESHFUSE_UCC_PROGRESS_THREAD=1 adds a thread that progresses the context while any
// Work is in flight (and makes the context thread-safe, UCC_THREAD_MULTIPLE). It is off by
// default: measured on 2 CPU ranks (BENCHMARKS.md, UCC section) it made overlapped
// allgather+matmul no faster, because a progress thread competes with the matmul for the cores the
// ranks already fill, and made small collectives slower (locking in every UCC call).
#pragma once
#include <ucc/api/ucc.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace meshfuse::ucc {

// Throws std::runtime_error "`what` failed: <UCC's message>" unless status is UCC_OK.
void check(ucc_status_t status, const char* what);

class Context {
 public:
  static Context& instance();
  ucc_context_h handle() const { return context_; }
  // One step of every posted operation of every team.
  void progress() { ucc_context_progress(context_); }
  // Works in flight (the progress thread runs only while there are some).
  void started();
  void finished();
  bool hasProgressThread() const { return thread_.joinable(); }

 private:
  Context();
  void runProgressThread();

  ucc_lib_h lib_ = nullptr;
  ucc_context_h context_ = nullptr;
  std::mutex mutex_;
  std::condition_variable busy_;
  int64_t in_flight_ = 0;
  std::thread thread_;
};

}  // namespace meshfuse::ucc

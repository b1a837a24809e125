// Gloo's collectives block the calling thread, while Backend promises asynchronous Work. Each
// GlooBackend runs its collectives on one worker thread (OpQueue: one FIFO, so operations run in
// the order they were posted, the same order on every rank); a GlooWork waits on the operation's
// future with a deadline. Staging holds the host buffers of one operation.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/backend.h"

namespace meshfuse::gloo_backend {

// The host memory an operation reads and writes: CPU tensors are used in place, CUDA tensors go
// through host copies, written back to the device once the operation has run.
class Staging {
 public:
  // A host pointer holding `t`'s bytes (itself for a CPU tensor).
  char* source(const Tensor& t);
  // The host pointer the operation writes `t`'s result into; `copy_in`: it also reads `t`.
  char* destination(const Tensor& t, bool copy_in);
  // Runs the copies back to the device (after the operation succeeded).
  void finish();

 private:
  std::vector<Tensor> keep_;                            // alive until the operation has run
  std::vector<std::pair<Tensor, Tensor>> copies_back_;  // (host staging tensor, CUDA destination)
};

// Host scratch memory for the worker's operations (reduce-scatter's reduced copy, a non-root's
// reduce buffer), kept and reused: a fresh buffer each call pays its page faults every time,
// which for 64 MiB cost more than the reduction itself. Only the worker thread uses it, one
// operation at a time; it keeps the largest size asked for until the backend goes.
class ScratchBuffer {
 public:
  char* get(size_t bytes);  // valid until the next get

 private:
  Tensor buffer_;
};

class OpQueue {
 public:
  OpQueue();
  // Runs what is still queued (the peers expect those operations), then stops the thread.
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;
  // Queues `op`; the future becomes ready when it has run (holding its exception if it threw).
  std::shared_future<void> post(std::function<void()> op);

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

// Runs `op` on a thread of its own (a point-to-point wait, which must not queue behind a
// collective or another rank's send could wait for a collective that waits for us).
std::shared_future<void> runDetached(std::function<void()> op);

class GlooWork final : public Work {
 public:
  // `what` names the operation, team, rank and backend for messages.
  GlooWork(std::string what, std::shared_future<void> done) : what_(std::move(what)), done_(std::move(done)) {}
  // Throws CommunicationTimeout when `timeout` passes first, or when Gloo's own operation
  // timeout fired; any other failure of the operation as std::runtime_error naming it.
  void wait(std::chrono::milliseconds timeout) override;
  bool test() override;

 private:
  std::string what_;
  std::shared_future<void> done_;
};

}  // namespace meshfuse::gloo_backend

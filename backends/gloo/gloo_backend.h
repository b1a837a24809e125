// The Gloo backend: every operation of Backend over a Gloo context of the team's own (TCP
// transport; the pairs' addresses are exchanged over MPI, see gloo_rendezvous.h). Gloo's
// collectives block, so each backend runs them on one worker thread in posting order, and a Work
// waits on the operation's future; sends and receives are posted at once on Gloo's unbound buffers
// and waited for on a thread each, so they never queue behind a collective. CUDA tensors are
// staged through host memory. Gloo headers stay out of this header (tests and other modules do
// not link Gloo).
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "backends/backend.h"

namespace gloo {
class Context;
}

namespace meshfuse {

class Communicator;
class SelfMailbox;

namespace gloo_backend {
class OpQueue;
class ScratchBuffer;
class Staging;
}  // namespace gloo_backend

class GlooBackend final : public Backend {
 public:
  // The deadline Gloo applies inside every operation, so a dead peer fails the worker's
  // operation instead of blocking it (and every later one) forever: MESHFUSE_TIMEOUT seconds,
  // 300 s by default. Work::wait's own timeout is separate and usually shorter.
  static std::chrono::milliseconds defaultOperationTimeout();

  // Collective over `team`: connects the team's Gloo context (a team of one needs none).
  GlooBackend(Communicator& communicator, const std::vector<int64_t>& team,
              std::chrono::milliseconds operation_timeout = defaultOperationTimeout());
  ~GlooBackend() override;

  bool supports(Device device) const override;

  std::unique_ptr<Work> allgather(const Tensor& input, Tensor& output) override;
  std::unique_ptr<Work> allreduce(Tensor& tensor, ReduceOp op) override;
  std::unique_ptr<Work> reduceScatter(const Tensor& input, Tensor& output, ReduceOp op) override;
  std::unique_ptr<Work> reduce(const Tensor& input, Tensor& output, int64_t root, ReduceOp op) override;
  std::unique_ptr<Work> broadcast(Tensor& tensor, int64_t root) override;
  std::unique_ptr<Work> gather(const Tensor& input, Tensor& output, int64_t root) override;
  std::unique_ptr<Work> scatter(const Tensor& input, Tensor& output, int64_t root) override;
  std::unique_ptr<Work> allToAll(const Tensor& input, Tensor& output) override;
  std::unique_ptr<Work> send(const Tensor& tensor, int64_t dst) override;
  std::unique_ptr<Work> recv(Tensor& tensor, int64_t src) override;
  std::unique_ptr<Work> barrier() override;

 private:
  // "gloo allgather (Float[8] cpu) on team [0, 1] at team rank 1 (world rank 1)".
  std::string describe(const std::string& op, const Tensor* tensor) const;
  // Queues a collective: `run(tag)` runs on the worker with this operation's Gloo tag, then the
  // staging's copies back. Posting order = execution order = tag order, the same on every rank.
  std::unique_ptr<Work> post(const std::string& what, std::shared_ptr<gloo_backend::Staging> staging,
                             std::function<void(uint32_t tag)> run);
  // A team of one: no peers, the operation is a local copy done now.
  bool alone() const { return teamSize() == 1; }

  std::chrono::milliseconds timeout_;
  std::shared_ptr<::gloo::Context> context_;  // null for a team of one
  std::unique_ptr<SelfMailbox> self_;
  std::shared_ptr<gloo_backend::ScratchBuffer> scratch_;  // the worker's
  std::atomic<uint32_t> next_tag_{1};                     // tag 0 was the connecting barrier
  std::unique_ptr<gloo_backend::OpQueue> queue_;          // last: its destructor drains before the rest goes
};

}  // namespace meshfuse

// The UCC backend: every operation of Backend as a non-blocking UCC collective on the team's UCC
// team (one per meshfuse team, ucc_team.h) in the process's one UCC context (ucc_context.h), on
// host memory, and on CUDA memory where UCC was built with CUDA (ucc_memory.h). Datatypes:
// ucc_types.h. Send and receive are UCC broadcasts over an active set of two ranks (UCC has no
// point-to-point call of its own); messages to oneself pass through a SelfMailbox. UCC headers
// stay out of this header.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/backend.h"

namespace meshfuse {

class Communicator;
class SelfMailbox;

namespace ucc {
class Team;
class UccWork;
}  // namespace ucc

class UccBackend final : public Backend {
 public:
  // Collective over `team`: creates its UCC team, waiting at most `timeout` for the members
  // (MESHFUSE_TIMEOUT seconds, 300 s by default).
  UccBackend(Communicator& communicator, const std::vector<int64_t>& team, std::chrono::milliseconds timeout);
  UccBackend(Communicator& communicator, const std::vector<int64_t>& team);
  ~UccBackend() override;

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
  // A point-to-point message between me and `peer` (a broadcast rooted at `root`, over {me, peer}).
  std::unique_ptr<Work> pointToPoint(const char* op, const Tensor& tensor, int64_t peer, int64_t root);

  std::unique_ptr<ucc::Team> team_;
  std::unique_ptr<SelfMailbox> self_;
  // Messages sent to / received from each team rank so far: a message's tag, the same on both
  // ends, so messages between two ranks match in posting order.
  std::vector<uint32_t> sent_, received_;
};

}  // namespace meshfuse

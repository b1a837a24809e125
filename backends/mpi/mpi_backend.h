// The Open MPI backend: every operation of Backend as a non-blocking MPI call on a communicator
// of its own (a duplicate of the team's, so its collectives never interleave with the
// Communicator's bootstrap traffic). CUDA tensors are staged through host memory.
#pragma once
#include <mpi.h>

#include <climits>

#include "backends/backend.h"

namespace meshfuse {

class Communicator;

class MpiBackend final : public Backend {
 public:
  // `max_count` is the most elements one MPI call carries (MPI counts are int): allreduce,
  // reduce, broadcast, send and recv split larger tensors; the block-wise collectives throw.
  // Tests lower it to exercise that path.
  MpiBackend(Communicator& communicator, const std::vector<int64_t>& team, int64_t max_count = INT_MAX);
  ~MpiBackend() override;

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
  // The element count of one MPI call; throws naming `op` when it does not fit.
  int blockCount(const char* op, int64_t numel) const;
  // `whole` must be teamSize() blocks of `block`'s size and dtype (allgather, gather, ...).
  void checkBlocks(const char* op, const char* whole_name, const Tensor& whole, const char* block_name,
                   const Tensor& block) const;
  // A root or peer (`role`) must be a team rank.
  void checkTeamRank(const char* op, const char* role, int64_t rank) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int64_t max_count_;
};

}  // namespace meshfuse

// The Backend interface: collectives over one team (an ordered list of world ranks) on flat,
// contiguous tensors. Every call is asynchronous and returns a Work; the host IR evaluator
// arranges axes (a gather along axis 2 is a flat allgather plus a copy). One Backend object exists
// per (backend type, team), created by the Communicator on first use by every member of the team.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace meshfuse {

// Python names: auto, nccl, ucc, mpi, gloo, cuda.
enum class CommunicatorBackend : uint8_t { Auto, Nccl, Ucc, Mpi, Gloo, Cuda };
std::string toString(CommunicatorBackend b);

enum class ReduceOp : uint8_t { Sum, Prod, Max, Min };
std::string toString(ReduceOp op);

// "[0, 2, 3]": how messages name a team.
std::string teamToString(const std::vector<int64_t>& team);

// A wait that ran past its deadline. The message names the communication, team, backend and wait.
class CommunicationTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done; throws CommunicationTimeout when `timeout` passes first.
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  // Whether it has finished (never blocks).
  virtual bool test() = 0;
};

// A Work that is already complete (a team of one, an empty tensor).
std::unique_ptr<Work> completedWork();

class Backend {
 public:
  Backend(CommunicatorBackend type, std::vector<int64_t> team, int64_t my_world_rank);
  virtual ~Backend() = default;
  CommunicatorBackend type() const { return type_; }
  const std::vector<int64_t>& team() const { return team_; }
  int64_t rankInTeam() const { return rank_in_team_; }
  int64_t teamSize() const { return static_cast<int64_t>(team_.size()); }
  // Whether tensors on `device` can be passed (the Gloo and MPI backends stage CUDA tensors).
  virtual bool supports(Device device) const = 0;
  // Whether operations are queued on the calling thread's current CUDA stream (NCCL, CUDA IPC):
  // work queued later on that stream runs after them, so a caller may chain compute behind a
  // communication without the host waiting for it. False for host-driven backends (MPI, Gloo).
  virtual bool ordersOnCurrentStream() const { return false; }

  // Roots are ranks within the team (0 .. teamSize()-1). All tensors contiguous, same dtype.
  // output.numel() == teamSize() * input.numel(); block i comes from team rank i.
  virtual std::unique_ptr<Work> allgather(const Tensor& input, Tensor& output) = 0;
  virtual std::unique_ptr<Work> allreduce(Tensor& tensor, ReduceOp op) = 0;  // in place
  // input.numel() == teamSize() * output.numel(); output = reduction of block rankInTeam().
  virtual std::unique_ptr<Work> reduceScatter(const Tensor& input, Tensor& output, ReduceOp op) = 0;
  // output is read only on root (may be undefined elsewhere).
  virtual std::unique_ptr<Work> reduce(const Tensor& input, Tensor& output, int64_t root, ReduceOp op) = 0;
  virtual std::unique_ptr<Work> broadcast(Tensor& tensor, int64_t root) = 0;  // in place
  // output (teamSize() blocks) only on root.
  virtual std::unique_ptr<Work> gather(const Tensor& input, Tensor& output, int64_t root) = 0;
  // input (teamSize() blocks) only on root.
  virtual std::unique_ptr<Work> scatter(const Tensor& input, Tensor& output, int64_t root) = 0;
  // Block j of input goes to team rank j; block i of output comes from team rank i.
  virtual std::unique_ptr<Work> allToAll(const Tensor& input, Tensor& output) = 0;
  virtual std::unique_ptr<Work> send(const Tensor& tensor, int64_t dst) = 0;
  virtual std::unique_ptr<Work> recv(Tensor& tensor, int64_t src) = 0;
  virtual std::unique_ptr<Work> barrier() = 0;

 private:
  CommunicatorBackend type_;
  std::vector<int64_t> team_;
  int64_t rank_in_team_;
};

}  // namespace meshfuse

// The NCCL backend: every collective of backends/backend.h on CUDA tensors, enqueued on the
// device's current stream (runtime/cuda/streams.h). One ncclComm per team, bootstrapped by team
// rank 0's ncclUniqueId sent through Communicator::allgatherBytes. A Work is a CUDA event; waiting
// past its deadline aborts the communicator (ncclCommAbort) and throws CommunicationTimeout.
// gather, scatter and all-to-all are grouped ncclSend/ncclRecv. Host tensors are refused.
#pragma once
#include <memory>
#include <vector>

#include "backends/backend.h"

namespace meshfuse {

class Communicator;

class NcclBackend final : public Backend {
 public:
  NcclBackend(Communicator& communicator, const std::vector<int64_t>& team);
  ~NcclBackend() override;
  bool supports(Device device) const override { return device.type == DeviceType::CUDA; }
  bool ordersOnCurrentStream() const override { return true; }
  int deviceIndex() const { return device_; }

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

  struct State;  // the communicator, shared with the Works (which may outlive the backend)

 private:
  std::unique_ptr<Work> finish(const std::string& op);
  void check(const std::string& op, const char* name, const Tensor& t) const;
  void checkRoot(const std::string& op, int64_t root) const;

  int device_ = 0;
  std::shared_ptr<State> state_;
  void* barrier_buffer_ = nullptr;  // one device int for barrier()
};

}  // namespace meshfuse

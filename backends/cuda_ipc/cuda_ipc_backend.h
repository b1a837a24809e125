// The CUDA IPC backend (CommunicatorBackend::Cuda): intra-node allgather, broadcast and send/recv
// by copy-engine cudaMemcpyAsync straight out of the peers' device memory. Each rank owns a
// cudaMalloc'ed staging buffer (IPC needs cudaMalloc memory, not pool memory), exported with
// cudaIpcGetMemHandle and re-exported when it grows, and two interprocess events: `ready` (its
// staging holds this operation's data) and `read` (it has finished reading its peers' staging).
// Per operation, on the current stream:
//   copy the contribution into staging, record ready  ─ host exchange (new handles) ─
//   wait for each peer's ready, copy out of its staging, record read  ─ host exchange ─
//   wait for each peer's read (so staging is not overwritten early).
// The host exchanges go through Communicator::allgatherBytes; every GPU-side wait is an event
// wait, so the host never blocks on the GPU. Several ranks may share one GPU.
#pragma once
#include <memory>
#include <vector>

#include "backends/backend.h"

namespace meshfuse {

class Communicator;

class CudaIpcBackend final : public Backend {
 public:
  CudaIpcBackend(Communicator& communicator, const std::vector<int64_t>& team);
  ~CudaIpcBackend() override;
  bool supports(Device device) const override { return device.type == DeviceType::CUDA; }
  bool ordersOnCurrentStream() const override { return true; }
  int deviceIndex() const { return device_; }
  size_t stagingBytes() const;

  std::unique_ptr<Work> allgather(const Tensor& input, Tensor& output) override;
  std::unique_ptr<Work> broadcast(Tensor& tensor, int64_t root) override;
  std::unique_ptr<Work> send(const Tensor& tensor, int64_t dst) override;
  std::unique_ptr<Work> recv(Tensor& tensor, int64_t src) override;
  std::unique_ptr<Work> barrier() override;
  // Not supported by the cuda backend (std::invalid_argument).
  std::unique_ptr<Work> allreduce(Tensor& tensor, ReduceOp op) override;
  std::unique_ptr<Work> reduceScatter(const Tensor& input, Tensor& output, ReduceOp op) override;
  std::unique_ptr<Work> reduce(const Tensor& input, Tensor& output, int64_t root, ReduceOp op) override;
  std::unique_ptr<Work> gather(const Tensor& input, Tensor& output, int64_t root) override;
  std::unique_ptr<Work> scatter(const Tensor& input, Tensor& output, int64_t root) override;
  std::unique_ptr<Work> allToAll(const Tensor& input, Tensor& output) override;

  struct Impl;

 private:
  void check(const std::string& op, const char* name, const Tensor& t) const;
  int device_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshfuse

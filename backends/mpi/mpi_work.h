// The Work of an MPI backend operation: its pending requests, the buffers they use, and the
// host-to-device copies that finish an operation on staged CUDA tensors.
#pragma once
#include <mpi.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/op_label.h"

namespace meshfuse::mpi {

using OpLabel = meshfuse::OpLabel;

class MpiWork final : public Work {
 public:
  // A cancellable Work (a recv) is cancelled on timeout; any other pending operation cannot be
  // (MPI forbids cancelling collectives, and Open MPI cannot cancel sends), so it is abandoned
  // together with its buffers.
  MpiWork(OpLabel label, bool cancellable) : label_(std::move(label)), cancellable_(cancellable) {}
  ~MpiWork() override;

  void wait(std::chrono::milliseconds timeout) override;
  bool test() override;

  // Filled by the backend while it issues the operation.
  std::vector<MPI_Request> requests;
  std::vector<std::shared_ptr<Storage>> buffers;       // kept alive until the requests complete
  std::vector<std::pair<Tensor, Tensor>> copies_back;  // (host staging tensor, CUDA destination)

 private:
  void finish();   // runs the copies back, once
  void abandon();  // hands pending requests and their buffers to a holder that is never freed

  OpLabel label_;
  bool cancellable_;
  bool finished_ = false;
};

}  // namespace meshfuse::mpi

// The Work of a UCC backend operation: its posted UCC requests, the buffers they use, and what
// finishes the operation once they complete (widened Half results rounded back into their
// tensors). test() and wait() progress the process's UCC context, which moves every team's data.
#pragma once
#include <ucc/api/ucc.h>

#include <cstdint>
#include <future>
#include <memory>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/op_label.h"

namespace meshfuse::ucc {

class UccWork final : public Work {
 public:
  explicit UccWork(OpLabel label);
  // An unfinished Work (dropped unwaited, or after a timeout) is abandoned with its buffers: UCC
  // cannot cancel a posted collective, and it may still write into them.
  ~UccWork() override;

  // Throws CommunicationTimeout when `timeout` passes first (the operation is abandoned), or
  // std::runtime_error naming the operation when UCC reports an error.
  void wait(std::chrono::milliseconds timeout) override;
  bool test() override;

  // Filled by the backend while it issues the operation.
  void post(ucc_team_h team, ucc_coll_args_t& args);   // ucc_collective_init + ucc_collective_post
  std::vector<std::shared_ptr<Storage>> buffers;       // kept alive until the requests complete
  std::vector<std::pair<Tensor, Tensor>> copies_back;  // (result, destination): destination.copyFrom(result)
  std::vector<std::pair<Tensor, Tensor>> keys_back;    // (keys, destination): ucc::fromOrderedKeys
  std::shared_future<void> from_self;                  // a receive from oneself (SelfMailbox), if valid
  std::vector<uint64_t> counts;  // a v-collective's counts and displacements, read by UCC until it completes

 private:
  void finish();
  void abandon();

  OpLabel label_;
  std::vector<ucc_coll_req_h> requests_;  // null once completed and finalized
  bool finished_ = false;
  bool abandoned_ = false;  // timed out (or failed): never done, every later wait fails at once
};

}  // namespace meshfuse::ucc

// Point-to-point messages a rank sends to itself (a team of one, or a pipeline stage whose next
// stage includes the same rank). Gloo has no pair to oneself and UCC's point-to-point (a broadcast
// over an active set of two) needs two distinct ranks, so they pass through memory: a send
// is copied at posting; a receive takes the oldest message, or waits for the next send. Like
// messages between two ranks, they match in posting order.
#pragma once
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>

#include "backends/backend.h"

namespace meshfuse {

class SelfMailbox {
 public:
  // `what` names the operation for errors (a size or dtype mismatch between send and receive).
  void send(const Tensor& tensor, const std::string& what);
  // Ready when a send has filled `tensor` (at once, if one is already waiting).
  std::shared_future<void> recv(Tensor& tensor, const std::string& what);

 private:
  struct PendingRecv {
    Tensor destination;
    std::string what;
    std::promise<void> done;
  };
  static void deliver(const Tensor& message, const std::string& send_what, PendingRecv& recv);

  std::mutex mutex_;
  std::deque<std::pair<Tensor, std::string>> messages_;  // sent, not yet received (with the send's name)
  std::deque<std::unique_ptr<PendingRecv>> receivers_;   // posted, not yet filled
};

}  // namespace meshfuse

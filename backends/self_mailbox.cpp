#include "backends/self_mailbox.h"

#include <stdexcept>

namespace meshfuse {

void SelfMailbox::deliver(const Tensor& message, const std::string& send_what, PendingRecv& recv) {
  if (message.dtype() != recv.destination.dtype() || message.numel() != recv.destination.numel()) {
    recv.done.set_exception(std::make_exception_ptr(
        std::invalid_argument(recv.what + ": the matching " + send_what + " sent " + message.toString() +
                              ", but the receive expects " + recv.destination.toString())));
    return;
  }
  recv.destination.copyFrom(message.view(recv.destination.shape()));
  recv.done.set_value();
}

void SelfMailbox::send(const Tensor& tensor, const std::string& what) {
  std::unique_ptr<PendingRecv> receiver;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (receivers_.empty()) {
      messages_.emplace_back(tensor.clone(), what);  // the sender may reuse its tensor at once
      return;
    }
    receiver = std::move(receivers_.front());
    receivers_.pop_front();
  }
  deliver(tensor, what, *receiver);
}

std::shared_future<void> SelfMailbox::recv(Tensor& tensor, const std::string& what) {
  auto receiver = std::make_unique<PendingRecv>(PendingRecv{tensor, what, {}});
  std::shared_future<void> done = receiver->done.get_future().share();
  std::pair<Tensor, std::string> message;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (messages_.empty()) {
      receivers_.push_back(std::move(receiver));
      return done;
    }
    message = std::move(messages_.front());
    messages_.pop_front();
  }
  deliver(message.first, message.second, *receiver);
  return done;
}

}  // namespace meshfuse

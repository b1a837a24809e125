#include "backends/gloo/gloo_work.h"

#include <cstdio>
#include <stdexcept>

#include "backends/poll_until.h"

namespace meshfuse::gloo_backend {

namespace {
std::string secondsSince(std::chrono::steady_clock::time_point start) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return text;
}
}  // namespace

char* Staging::source(const Tensor& t) {
  Tensor host = t.to(Device::cpu());  // itself for a CPU tensor
  keep_.push_back(host);
  return static_cast<char*>(host.data());
}

char* Staging::destination(const Tensor& t, bool copy_in) {
  if (t.device().type == DeviceType::CPU) {
    keep_.push_back(t);
    return static_cast<char*>(t.data());
  }
  Tensor host = copy_in ? t.to(Device::cpu()) : Tensor::empty(t.shape(), t.dtype());
  copies_back_.emplace_back(host, t);
  return static_cast<char*>(host.data());
}

char* ScratchBuffer::get(size_t bytes) {
  if (!buffer_.defined() || buffer_.nbytes() < bytes)
    buffer_ = Tensor::empty({static_cast<int64_t>(bytes)}, DataType::Bool);  // one byte an element
  return static_cast<char*>(buffer_.data());
}

void Staging::finish() {
  for (auto& [host, device] : copies_back_)
    cudaCopyBytes(device.data(), device.device(), host.data(), Device::cpu(), host.nbytes());
  copies_back_.clear();
  keep_.clear();
}

OpQueue::OpQueue() : worker_([this] { run(); }) {}

OpQueue::~OpQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_one();
  worker_.join();
}

std::shared_future<void> OpQueue::post(std::function<void()> op) {
  std::packaged_task<void()> task(std::move(op));
  std::shared_future<void> done = task.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  ready_.notify_one();
  return done;
}

void OpQueue::run() {
  while (true) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // an exception is stored in the task's future
  }
}

std::shared_future<void> runDetached(std::function<void()> op) {
  std::packaged_task<void()> task(std::move(op));
  std::shared_future<void> done = task.get_future().share();
  std::thread(std::move(task)).detach();
  return done;
}

void GlooWork::wait(std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  // Polled (spin, then yield, then sleep: poll_until.h) rather than blocked on the future: a
  // blocked waiter lets its CPU idle, and on a VM an idle vCPU took about 4 ms to wake for the
  // worker's and Gloo's threads (bench_collectives, 1 KiB allreduce on 2 ranks of a 2-vCPU VM:
  // 3.6 ms blocked, 0.84 ms polled; BENCHMARKS.md). Yielding hands the CPU to those threads at once.
  if (!pollUntil([&] { return test(); }, start + timeout))
    throw CommunicationTimeout(what_ + ": waited " + secondsSince(start) + " (timeout " +
                               std::to_string(timeout.count()) + " ms); a member of the team did not take part");
  try {
    done_.get();
  } catch (const CommunicationTimeout&) {
    throw;
  } catch (const std::exception& e) {
    const std::string message = e.what();
    // Gloo's own deadline (the backend's operation timeout) fired inside the operation.
    if (message.find("Timed out") != std::string::npos || message.find("timeout") != std::string::npos)
      throw CommunicationTimeout(what_ + ": gloo gave up waiting for a peer: " + message);
    throw std::runtime_error(what_ + " failed: " + message);
  }
}

bool GlooWork::test() { return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }

}  // namespace meshfuse::gloo_backend

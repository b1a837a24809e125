#include "backends/wait_interrupt.h"

#include <atomic>

namespace meshfuse {

namespace {
std::atomic<InterruptCheck> interrupt_check{nullptr};
}  // namespace

void setWaitInterruptCheck(InterruptCheck check) { interrupt_check.store(check, std::memory_order_release); }

void throwIfWaitInterrupted() {
  const InterruptCheck check = interrupt_check.load(std::memory_order_acquire);
  if (check != nullptr && check())
    throw WaitInterrupted("interrupted (SIGINT, Ctrl-C) while waiting for the other ranks");
}

}  // namespace meshfuse

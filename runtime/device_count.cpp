#include "runtime/device_count.h"

#include <atomic>

namespace meshfuse {

namespace {
std::atomic<int (*)()> g_counter{nullptr};
}

bool registerCudaDeviceCounter(int (*counter)()) {
  g_counter.store(counter);
  return true;
}

int cudaDeviceCountOrZero() {
  int (*counter)() = g_counter.load();
  return counter ? counter() : 0;
}

}  // namespace meshfuse

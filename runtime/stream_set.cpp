#include "runtime/stream_set.h"

#include <atomic>

namespace meshfuse {

namespace {
std::atomic<StreamSetFactory> g_factory{nullptr};
}

bool registerStreamSetFactory(StreamSetFactory factory) {
  g_factory.store(factory);
  return true;
}

std::unique_ptr<StreamSet> makeStreamSet(Device device, int64_t depth, bool timing, int sm_margin) {
  StreamSetFactory factory = g_factory.load();
  if (factory == nullptr) return nullptr;
  return factory(device, depth, timing, sm_margin);
}

}  // namespace meshfuse

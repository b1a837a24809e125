// Asynchronous chunk streams for the host IR's stream loops (ParallelType::stream), without CUDA
// headers: chunk i's communication and compute are queued on stream i % depth of a device's pool,
// so chunk i+1's communication runs on the GPU while chunk i's matmul computes and the host only
// queues work. The CUDA runtime installs the implementation; without one (a CPU tensor, a build
// without CUDA) makeStreamSet returns nullptr and the loop runs chunks from the host.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/tensor.h"

namespace meshfuse {

class StreamSet {
 public:
  virtual ~StreamSet() = default;
  // Makes chunk `chunk`'s stream the current one (until the next enter() or join()).
  virtual void enter(int64_t chunk) = 0;
  // The caller's stream waits (on the device, not the host) for everything queued on the chunk
  // streams, and becomes current again. Tensors freed after join() are freed in its order.
  virtual void join() = 0;
  // With timing on: records an event on the current stream and returns its index, else -1.
  virtual int mark() = 0;
  // Waits for the marks and returns when each ran, in microseconds on the clock where the set was
  // created at `created_us` (the caller's stream is drained at creation when timing is on).
  virtual std::vector<double> markTimesUs(double created_us) = 0;
};

// sm_margin: multiprocessors the matmuls queued through the set leave free (0: none).
using StreamSetFactory = std::unique_ptr<StreamSet> (*)(Device device, int64_t depth, bool timing, int sm_margin);
// Called once by the CUDA runtime when libmeshfuse loads.
bool registerStreamSetFactory(StreamSetFactory factory);
// Streams for `device` (the pool streams first wait for work already queued on the caller's
// current stream); nullptr where no implementation serves the device.
std::unique_ptr<StreamSet> makeStreamSet(Device device, int64_t depth, bool timing, int sm_margin = 0);

}  // namespace meshfuse

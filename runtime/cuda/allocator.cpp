// The CUDA caching allocator: one cudaMallocAsync memory pool per device whose release threshold
// is unlimited, so freed blocks stay cached in the pool and a steady-state execution allocates no
// new device memory. Allocations and frees are ordered on the calling thread's current stream;
// the pool's event dependencies make reuse across streams safe.
//
// In front of the pool, a host-side cache of blocks freed on a stream hands them back to the next
// allocation of the same rounded size on that stream without a driver call (MESHFUSE_CUDA_BLOCK_CACHE=0 turns it off):
// cudaMallocAsync and cudaFreeAsync cost 1-5 us of host time each, and a small layer's step makes
// about sixty of each (BENCHMARKS.md, session 25). Reuse on the stream the block was freed on is the
// reuse the pool itself makes (the free is ordered after that stream's work, and so is the next
// allocation's), so the cache changes no ordering; it bounds what it holds and gives everything
// back before an allocation that fails.
#include "runtime/cuda/allocator.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/streams.h"
#include "runtime/host_span.h"
#include "runtime/tensor.h"

namespace meshfuse {

namespace {
constexpr int kMaxDevices = 64;

// On unless MESHFUSE_CUDA_BLOCK_CACHE=0; read at each allocation and free (a test turns it off for a
// scope, and a user rules it out when chasing memory).
bool blockCacheEnabled() {
  const char* e = std::getenv("MESHFUSE_CUDA_BLOCK_CACHE");
  return e == nullptr || std::string(e) != "0";
}

// Blocks freed on a stream, by rounded size, for the next allocation of that size there. Bounded:
// blocks above kLargestBlock go straight back to the pool (their allocation's host cost is small
// beside the work on them), and so does a block that would take the cache above kMostHeld. Keyed by
// the stream's handle, which is safe because meshfuse's current streams are only the legacy default
// stream and the pool's streams (streams.cpp), both alive until the process ends: a handle never
// comes back as another stream whose work would not be ordered after the free.
class SameStreamBlocks {
 public:
  static constexpr size_t kGranule = 512;
  static constexpr size_t kLargestBlock = size_t{256} << 20;
  static constexpr size_t kMostHeld = size_t{2} << 30;

  static size_t rounded(size_t bytes) { return (bytes + kGranule - 1) / kGranule * kGranule; }

  void* take(cudaStream_t stream, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find({stream, bytes});
    if (it == blocks_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    held_ -= bytes;
    return p;
  }

  // Whether the cache took the block (else the caller frees it).
  bool keep(cudaStream_t stream, void* p, size_t bytes) {
    if (bytes > kLargestBlock) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    if (held_ + bytes > kMostHeld) return false;
    blocks_[{stream, bytes}].push_back(p);
    held_ += bytes;
    return true;
  }

  // Every block, with the stream it was freed on, emptying the cache.
  std::vector<std::pair<cudaStream_t, void*>> drain() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<cudaStream_t, void*>> all;
    for (auto& [key, ptrs] : blocks_)
      for (void* p : ptrs) all.emplace_back(key.first, p);
    blocks_.clear();
    held_ = 0;
    return all;
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<cudaStream_t, size_t>, std::vector<void*>> blocks_;
  size_t held_ = 0;
};

class CudaPoolAllocator final : public Allocator {
 public:
  explicit CudaPoolAllocator(int device) : device_(device) {
    cuda::DeviceGuard guard(device);
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    MESHFUSE_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    uint64_t keep_everything = std::numeric_limits<uint64_t>::max();
    MESHFUSE_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  }

  void* allocate(size_t requested) override {
    if (requested == 0) return nullptr;
    // Every block is allocated at its rounded size, so that one freed while the cache is on has at
    // least the bytes its key says, whenever it was allocated.
    const size_t bytes = SameStreamBlocks::rounded(requested);
    cudaStream_t stream = cuda::currentStream(device_);
    if (blockCacheEnabled()) {
      if (void* cached = blocks_.take(stream, bytes)) {
        in_use_ += static_cast<int64_t>(requested);
        return cached;
      }
    }
    host_span::Scope span("cudaMallocAsync");
    cuda::DeviceGuard guard(device_);
    void* p = nullptr;
    cudaError_t err = cudaMallocAsync(&p, bytes, pool_, stream);
    if (err == cudaErrorMemoryAllocation) {
      // Give the cached blocks back to the device and try once more before failing.
      cudaGetLastError();
      for (auto [freed_on, block] : blocks_.drain()) MESHFUSE_CUDA_CHECK(cudaFreeAsync(block, freed_on));
      MESHFUSE_CUDA_CHECK(cudaDeviceSynchronize());
      MESHFUSE_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
      err = cudaMallocAsync(&p, bytes, pool_, stream);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error("CUDA allocation of " + std::to_string(requested) +
                               " bytes on cuda:" + std::to_string(device_) + " failed: " + cudaGetErrorString(err) +
                               " (" + std::to_string(in_use_.load()) + " bytes in use)");
    }
    in_use_ += static_cast<int64_t>(requested);
    return p;
  }

  // Never throws: it runs from Storage's destructor, possibly after the CUDA runtime has unloaded at
  // exit, when the memory is gone with the process anyway.
  void deallocate(void* ptr, size_t requested) override {
    if (ptr == nullptr) return;
    in_use_ -= static_cast<int64_t>(requested);
    if (blockCacheEnabled() && blocks_.keep(cuda::currentStream(device_), ptr, SameStreamBlocks::rounded(requested)))
      return;
    host_span::Scope span("cudaFreeAsync");
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) return;
    if (previous != device_) cudaSetDevice(device_);
    if (cudaFreeAsync(ptr, cuda::currentStream(device_)) != cudaSuccess) cudaGetLastError();
    if (previous != device_) cudaSetDevice(previous);
  }

  Device device() const override { return Device::cuda(device_); }
  int64_t inUse() const { return in_use_.load(); }
  int64_t reserved() const {
    uint64_t bytes = 0;
    cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &bytes);
    return static_cast<int64_t>(bytes);
  }

 private:
  int device_;
  cudaMemPool_t pool_ = nullptr;
  std::atomic<int64_t> in_use_{0};
  SameStreamBlocks blocks_;
};

std::array<std::once_flag, kMaxDevices> g_created;
std::array<CudaPoolAllocator*, kMaxDevices> g_allocators{};  // never deleted: tensors may outlive main()

CudaPoolAllocator& allocatorOf(int device) {
  if (device < 0 || device >= kMaxDevices)
    throw std::invalid_argument("CUDA device index " + std::to_string(device) + " is out of range");
  std::call_once(g_created[device], [device] {
    std::string why;
    int count = cuda::deviceCount(&why);
    if (device >= count)
      throw std::invalid_argument("cuda:" + std::to_string(device) + " does not exist (" + std::to_string(count) +
                                  " CUDA devices" + (why.empty() ? "" : ": " + why) + ")");
    g_allocators[device] = new CudaPoolAllocator(device);
  });
  if (g_allocators[device] == nullptr)
    throw std::invalid_argument("cuda:" + std::to_string(device) + " has no allocator (its creation failed)");
  return *g_allocators[device];
}
}  // namespace

Allocator* cudaAllocator(int device_index) { return &allocatorOf(device_index); }

int64_t cuda::bytesInUse(int device) { return allocatorOf(device).inUse(); }
int64_t cuda::bytesReserved(int device) { return allocatorOf(device).reserved(); }

void cudaCopyBytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  host_span::Scope span("host-device copy (waits for it)");
  // The copy is queued on the current stream of the CUDA side (the destination's when both are), so
  // it orders after the kernels that produced the source there; then the host waits for it.
  const Device side = dst_device.type == DeviceType::CUDA ? dst_device : src_device;
  cuda::DeviceGuard guard(side.index);
  cudaStream_t stream = cuda::currentStream(side.index);
  if (dst_device.type == DeviceType::CUDA && src_device.type == DeviceType::CUDA &&
      dst_device.index != src_device.index) {
    // The source device's queued work must be complete before a peer copy reads it.
    cuda::synchronizeStream(src_device.index, cuda::currentStream(src_device.index));
    MESHFUSE_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes, stream));
  } else {
    MESHFUSE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  }
  MESHFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace meshfuse

// The vectorized strided copy (see strided_copy.h).
#include "runtime/cuda/strided_copy.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "runtime/cpu/strided_space.h"
#include "runtime/cuda/kernel_cache.h"
#include "runtime/cuda/streams.h"

namespace meshfuse::cuda {

namespace {
constexpr int kMaxAxes = 6;
constexpr int64_t kVectorBytes = 16;

// Axes are in units of 16-byte vectors; the last axis has stride 1 on both sides. Index is the
// flat vector index of the copied space (row-major over the destination's shape).
const char* const kKernel = R"(
template <typename I>
struct Params {
  const uint4* src;
  uint4* dst;
  I numel;
  int rank;
  I sizes[6];
  I strides[6];
  I dst_strides[6];
};
template <typename I>
__device__ void copyVectors(const Params<I>& p) {
  const I step = (I)gridDim.x * blockDim.x;
  for (I v = (I)blockIdx.x * blockDim.x + threadIdx.x; v < p.numel; v += step) {
    I rest = v, offset = 0, dst_offset = 0;
    for (int d = p.rank - 1; d > 0; --d) {
      const I q = rest / p.sizes[d];
      const I i = rest - q * p.sizes[d];
      offset += i * p.strides[d];
      dst_offset += i * p.dst_strides[d];
      rest = q;
    }
    offset += rest * p.strides[0];
    dst_offset += rest * p.dst_strides[0];
    p.dst[dst_offset] = p.src[offset];
  }
}
extern "C" __global__ void meshfuse_vector_copy32(Params<unsigned> p) { copyVectors(p); }
extern "C" __global__ void meshfuse_vector_copy64(Params<unsigned long long> p) { copyVectors(p); }
)";

template <typename I>
struct Params {
  const void* src;
  void* dst;
  I numel;
  int rank;
  I sizes[kMaxAxes];
  I strides[kMaxAxes];
  I dst_strides[kMaxAxes];
};

template <typename I>
void launch(int device, const char* name, const void* src, void* dst, const cpu::StridedSpace& space, int64_t numel) {
  Params<I> p{};
  p.src = src;
  p.dst = dst;
  p.numel = static_cast<I>(numel);
  p.rank = static_cast<int>(space.rank());
  for (int d = 0; d < p.rank; ++d) {
    p.sizes[d] = static_cast<I>(space.shape[d]);
    p.strides[d] = static_cast<I>(space.strides[0][d]);
    p.dst_strides[d] = static_cast<I>(space.strides[1][d]);
  }
  // One cache entry per entry point (the cache is keyed by the key alone).
  KernelFunction kernel = cachedKernel(
      device, name, [] { return vectorizedCopySource(); }, name);
  const int64_t threads = 256;
  const int64_t blocks = std::min<int64_t>((numel + threads - 1) / threads, int64_t{multiprocessorCount(device)} * 16);
  launchKernel(kernel, static_cast<unsigned>(blocks), static_cast<unsigned>(threads), currentStream(device), &p);
}
}  // namespace

std::string vectorizedCopySource() { return kKernel; }

bool tryVectorizedCopy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() != src.dtype() || dst.device() != src.device() || dst.device().type != DeviceType::CUDA ||
      dst.shape() != src.shape() || src.dim() == 0)
    return false;
  const int64_t esize = static_cast<int64_t>(dataTypeSize(src.dtype()));
  if (kVectorBytes % esize != 0) return false;
  const int64_t per_vector = kVectorBytes / esize;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0; };
  if (!aligned(src.data()) || !aligned(dst.data())) return false;
  cpu::StridedSpace space{src.shape(), {src.strides(), dst.strides()}};
  space.coalesce();
  if (space.rank() == 0 || space.rank() > kMaxAxes) return false;
  const int64_t last = space.rank() - 1;
  if (space.shape[last] % per_vector != 0) return false;
  if (space.rank() == 1) return false;  // both sides dense: the plain copy is as good
  for (const std::vector<int64_t>& strides : space.strides) {
    if (strides[last] != 1) return false;
    for (int64_t d = 0; d < last; ++d)
      if (strides[d] % per_vector != 0 || strides[d] < 0) return false;
  }
  for (int64_t d = 0; d < last; ++d)  // a destination that repeats elements is not a copy target
    if (space.strides[1][d] == 0) return false;
  // Into vector units.
  space.shape[last] /= per_vector;
  for (std::vector<int64_t>& strides : space.strides)
    for (int64_t d = 0; d < last; ++d) strides[d] /= per_vector;
  const int64_t numel = src.numel() / per_vector;
  int64_t reach = 0;  // the largest vector offset on either side, for the index width
  for (const std::vector<int64_t>& strides : space.strides) {
    int64_t side = 0;
    for (int64_t d = 0; d <= last; ++d) side += (space.shape[d] - 1) * strides[d];
    reach = std::max(reach, side);
  }
  const int device = dst.device().index;
  DeviceGuard guard(device);
  constexpr int64_t kMax32 = std::numeric_limits<uint32_t>::max();
  if (numel < kMax32 && reach < kMax32)
    launch<uint32_t>(device, "meshfuse_vector_copy32", src.data(), dst.data(), space, numel);
  else
    launch<uint64_t>(device, "meshfuse_vector_copy64", src.data(), dst.data(), space, numel);
  return true;
}

}  // namespace meshfuse::cuda

// Scratch memory aligned to a cache line, for the CPU kernels' tile and row buffers.
// malloc (and so std::vector and new T[]) aligns to 16 bytes: a 64-byte AVX-512 load or store from
// such a buffer crosses a cache line three times in four and costs two accesses. The pointwise
// engine's 18-op GELU backward ran 17% faster with its tile buffers aligned (BENCHMARKS.md).
// Tensors are aligned already (runtime/tensor.cpp).
#pragma once
#include <cstddef>
#include <new>
#include <type_traits>
#include <vector>

namespace meshfuse::cpu {

inline constexpr std::size_t kCacheLine = 64;

template <typename T>
struct CacheLineAllocator {
  static_assert(alignof(T) <= kCacheLine);
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  explicit CacheLineAllocator(const CacheLineAllocator<U>& /*other*/) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kCacheLine})); }
  void deallocate(T* p, std::size_t /*n*/) noexcept { ::operator delete (p, std::align_val_t{kCacheLine}); }
  friend bool operator==(const CacheLineAllocator& /*a*/, const CacheLineAllocator& /*b*/) { return true; }
};

// A std::vector whose data starts on a cache line.
template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace meshfuse::cpu

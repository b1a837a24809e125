// Moving one tile (a run of consecutive row-major linear indices of a result) between a tensor of
// any strides and dtype and a dense buffer of the compute type.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "runtime/cpu/element_traits.h"
#include "runtime/cpu/half_runs.h"

namespace meshfuse::cpu {

// dst[i] = src[i] for i < n, converted to T. Runs of Half and BFloat16 to float go through the
// vectorized conversions (half_runs.h): converted one by one, they took most of a 16-bit kernel's time.
template <typename S, typename T>
void loadRun(const S* __restrict src, T* __restrict dst, int64_t n) {
  // HalfBits and BFloat16Bits are a uint16_t each, so a run of them is a run of uint16_t.
  constexpr bool kHalf = std::is_same_v<S, HalfBits> && std::is_same_v<T, float>;
  constexpr bool kBf16 = std::is_same_v<S, BFloat16Bits> && std::is_same_v<T, float>;
  if constexpr (kHalf) {
    halfToFloatRun(reinterpret_cast<const uint16_t*>(src), dst, n);
  } else if constexpr (kBf16) {
    bf16ToFloatRun(reinterpret_cast<const uint16_t*>(src), dst, n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = Elem<S>::template load<T>(src[i]);
  }
}

// dst[i] = base[offset of linear index start + i] for i < len, walking `shape`/`strides` (a
// coalesced space, see StridedSpace) in row-major order, converted to T.
template <typename S, typename T>
void gatherTile(const S* base, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, int64_t start,
                int64_t len, T* __restrict dst) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank == 0) {
    std::fill(dst, dst + len, Elem<S>::template load<T>(base[0]));
    return;
  }
  int64_t index[16];
  int64_t offset = 0;
  for (int64_t d = rank - 1, rem = start; d >= 0; --d) {
    index[d] = rem % shape[d];
    rem /= shape[d];
    offset += index[d] * strides[d];
  }
  const int64_t inner = shape[rank - 1], inner_stride = strides[rank - 1];
  int64_t done = 0;
  while (done < len) {
    const int64_t run = std::min(inner - index[rank - 1], len - done);
    const S* src = base + offset;
    // cppcheck-suppress constStatement ; a declaration (cppcheck misreads the template's T)
    T* out = dst + done;
    if (inner_stride == 1) {
      loadRun<S, T>(src, out, run);
    } else if (inner_stride == 0) {
      std::fill(out, out + run, Elem<S>::template load<T>(src[0]));
    } else {
      for (int64_t i = 0; i < run; ++i) out[i] = Elem<S>::template load<T>(src[i * inner_stride]);
    }
    done += run;
    offset += run * inner_stride;
    index[rank - 1] += run;
    // Carry into the outer axes once the inner one wraps.
    for (int64_t d = rank - 1; d > 0 && index[d] == shape[d]; --d) {
      offset -= shape[d] * strides[d];
      index[d] = 0;
      ++index[d - 1];
      offset += strides[d - 1];
    }
  }
}

// dst[i] = src[i] rounded to the storage type S, for i < n; runs of float to Half and BFloat16 through
// the vectorized conversions, as loadRun.
template <typename S, typename T>
void storeTile(const T* __restrict src, S* __restrict dst, int64_t n) {
  constexpr bool kHalf = std::is_same_v<S, HalfBits> && std::is_same_v<T, float>;
  constexpr bool kBf16 = std::is_same_v<S, BFloat16Bits> && std::is_same_v<T, float>;
  if constexpr (kHalf) {
    floatToHalfRun(src, reinterpret_cast<uint16_t*>(dst), n);
  } else if constexpr (kBf16) {
    floatToBf16Run(src, reinterpret_cast<uint16_t*>(dst), n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = Elem<S>::template store<T>(src[i]);
  }
}

}  // namespace meshfuse::cpu

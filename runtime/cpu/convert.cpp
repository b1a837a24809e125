#include "runtime/cpu/convert.h"

#include <algorithm>
#include <type_traits>

#include "runtime/cpu/element_traits.h"
#include "runtime/cpu/strided_space.h"
#include "runtime/cpu/tile_io.h"

namespace meshfuse::cpu {

namespace {
constexpr int64_t kTile = 2048;
constexpr int64_t kParallelThreshold = 1 << 15;
}  // namespace

Tensor convertToContiguous(const Tensor& src, DataType dtype) {
  Tensor dst = Tensor::empty(src.shape(), dtype, src.device());
  const int64_t numel = src.numel();
  if (numel == 0) return dst;
  StridedSpace space{src.shape(), {src.strides()}};
  space.coalesce();
  dispatchStorage(src.dtype(), [&](auto src_tag) {
    using S = typename decltype(src_tag)::type;
    dispatchStorage(dtype, [&](auto dst_tag) {
      using D = typename decltype(dst_tag)::type;
      // Carry values in a type that holds both ends exactly: int64 between integer types, float
      // between types of at most float precision, double otherwise.
      using C = std::conditional_t < !kIsFloatStorage<S> && !kIsFloatStorage<D>, int64_t,
            std::conditional_t < std::is_same_v<S, double> || std::is_same_v<D, double> || std::is_same_v<S, int64_t> ||
                std::is_same_v<D, int64_t> || std::is_same_v<S, int32_t> || std::is_same_v<D, int32_t>,
            double, float >>
          ;
      const S* in = src.dataAs<const S>();
      D* out = dst.dataAs<D>();
      const int64_t tiles = (numel + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (numel >= kParallelThreshold)
      for (int64_t t = 0; t < tiles; ++t) {
        // cppcheck-suppress constStatement ; a declaration (cppcheck misreads C, a type chosen above)
        C buf[kTile];
        const int64_t start = t * kTile, len = std::min(kTile, numel - start);
        gatherTile<S, C>(in, space.shape, space.strides[0], start, len, buf);
        storeTile<D, C>(buf, out + start, len);
      }
    });
  });
  return dst;
}

}  // namespace meshfuse::cpu

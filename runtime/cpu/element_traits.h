// Storage element types of the CPU kernels and their conversions to and from a compute type.
// Half and BFloat16 share uint16_t storage, and Bool is a byte, so each gets its own tag struct:
// a kernel templated on the storage type then converts correctly on every load and store.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "runtime/cpu/half_runs.h"
#include "runtime/dtype.h"
#include "runtime/half.h"

namespace meshfuse::cpu {

struct HalfBits {
  uint16_t bits;
};
struct BFloat16Bits {
  uint16_t bits;
};
struct BoolByte {
  uint8_t value;
};

// load<C>(s): the stored element as compute type C; store<C>(v): v rounded to the storage type
// (float -> int truncates toward zero, -> 16-bit floats rounds to nearest even, -> bool is != 0).
template <typename S>
struct Elem {
  template <typename C>
  static C load(S s) {
    return static_cast<C>(s);
  }
  template <typename C>
  static S store(C v) {
    return static_cast<S>(v);
  }
};

// Half and BFloat16: through float32 with their round-to-nearest-even conversions.
template <typename Bits, float (*kToFloat)(uint16_t), uint16_t (*kFromFloat)(float)>
struct SixteenBitElem {
  template <typename C>
  static C load(Bits s) {
    return static_cast<C>(kToFloat(s.bits));
  }
  template <typename C>
  static Bits store(C v) {
    return {kFromFloat(static_cast<float>(v))};
  }
};
template <>
struct Elem<HalfBits> : SixteenBitElem<HalfBits, halfToFloat, floatToHalf> {};
template <>
struct Elem<BFloat16Bits> : SixteenBitElem<BFloat16Bits, bf16ToFloat, floatToBf16> {};

template <>
struct Elem<BoolByte> {
  template <typename C>
  static C load(BoolByte s) {
    return static_cast<C>(s.value != 0);
  }
  template <typename C>
  static BoolByte store(C v) {
    return {static_cast<uint8_t>(v != C(0))};
  }
};

// Elem<S>::load<C>, for loops over many elements: Half through its branch-free form (half_runs.h),
// so that the loop vectorizes (halfToFloat's branches keep it scalar). The same value either way.
template <typename S, typename C>
[[gnu::always_inline]] inline C loadInLoop(S s) {
  if constexpr (std::is_same_v<S, HalfBits>)
    return static_cast<C>(halfToFloatSelect(s.bits));
  else
    return Elem<S>::template load<C>(s);
}

// Whether storage type S holds a floating-point dtype.
template <typename S>
constexpr bool kIsFloatStorage = std::is_same_v<S, float> || std::is_same_v<S, double> || std::is_same_v<S, HalfBits> ||
                                 std::is_same_v<S, BFloat16Bits>;

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<S>{}) with S the storage type of `dtype`.
template <typename F>
decltype(auto) dispatchStorage(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::Float: return f(TypeTag<float>{});
    case DataType::Double: return f(TypeTag<double>{});
    case DataType::Half: return f(TypeTag<HalfBits>{});
    case DataType::BFloat16: return f(TypeTag<BFloat16Bits>{});
    case DataType::Int: return f(TypeTag<int64_t>{});
    case DataType::Int32: return f(TypeTag<int32_t>{});
    case DataType::Bool: return f(TypeTag<BoolByte>{});
  }
  throw std::invalid_argument("dispatchStorage: unknown DataType");
}

// The value `v` takes once rounded to `dtype` and read back, in compute type C: what a cast does
// in the middle of a fused computation.
template <typename C>
C roundTo(DataType dtype, C v) {
  return dispatchStorage(dtype, [v](auto tag) {
    using S = typename decltype(tag)::type;
    return Elem<S>::template load<C>(Elem<S>::template store<C>(v));
  });
}

}  // namespace meshfuse::cpu

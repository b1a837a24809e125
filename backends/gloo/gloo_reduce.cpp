#include "backends/gloo/gloo_reduce.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "runtime/half.h"
#include "runtime/nan_propagating.h"

namespace meshfuse::gloo_backend {

namespace {

struct Add {
  template <typename T>
  T operator()(T a, T b) const {
    return a + b;
  }
};
struct Mul {
  template <typename T>
  T operator()(T a, T b) const {
    return a * b;
  }
};
struct Max {
  template <typename T>
  T operator()(T a, T b) const {
    return nanPropagatingMax(a, b);
  }
};
struct Min {
  template <typename T>
  T operator()(T a, T b) const {
    return nanPropagatingMin(a, b);
  }
};

// A plain loop over T: the compiler vectorizes it for the types the CPU has lanes for.
template <typename T, typename Combine>
void combine(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Combine{}(x[i], y[i]);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float), typename Combine>
void combine16(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = FromFloat(Combine{}(ToFloat(x[i]), ToFloat(y[i])));
}

template <bool Any>
void combineBool(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<uint8_t*>(out);
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Any ? (x[i] != 0 || y[i] != 0) : (x[i] != 0 && y[i] != 0);
}

// One function per ReduceOp (in enum order) for an element type handled by `Kernel`.
template <template <typename> class Kernel>
constexpr ReduceFunction byOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return Kernel<Add>::fn;
    case ReduceOp::Prod: return Kernel<Mul>::fn;
    case ReduceOp::Max: return Kernel<Max>::fn;
    case ReduceOp::Min: return Kernel<Min>::fn;
  }
  return nullptr;
}

template <typename T>
struct Typed {
  template <typename Combine>
  struct Kernel {
    static constexpr ReduceFunction fn = &combine<T, Combine>;
  };
};
template <typename Combine>
struct HalfKernel {
  static constexpr ReduceFunction fn = &combine16<halfToFloat, floatToHalf, Combine>;
};
template <typename Combine>
struct Bf16Kernel {
  static constexpr ReduceFunction fn = &combine16<bf16ToFloat, floatToBf16, Combine>;
};

}  // namespace

ReduceFunction reduceFunctionFor(DataType dtype, ReduceOp op) {
  ReduceFunction fn = nullptr;
  switch (dtype) {
    case DataType::Float: fn = byOp<Typed<float>::Kernel>(op); break;
    case DataType::Double: fn = byOp<Typed<double>::Kernel>(op); break;
    case DataType::Half: fn = byOp<HalfKernel>(op); break;
    case DataType::BFloat16: fn = byOp<Bf16Kernel>(op); break;
    case DataType::Int: fn = byOp<Typed<int64_t>::Kernel>(op); break;
    case DataType::Int32: fn = byOp<Typed<int32_t>::Kernel>(op); break;
    case DataType::Bool:
      fn = (op == ReduceOp::Sum || op == ReduceOp::Max) ? &combineBool<true> : &combineBool<false>;
      break;
  }
  if (fn == nullptr)
    throw std::invalid_argument("gloo backend: no reduction " + toString(op) + " for " + toString(dtype));
  return fn;
}

}  // namespace meshfuse::gloo_backend

// The element functions of pointwise ops, applied over dense tile buffers in a compute type T
// (float, double or int64_t). The op is resolved once per tile, outside the loops, so every loop
// is a plain, vectorizable pass over L1-resident data, built for AVX-512, AVX2 and the baseline
// (simd_clones.h).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "ir/ir.h"
#include "runtime/cpu/element_traits.h"
#include "runtime/cpu/fast_exp.h"
#include "runtime/cpu/half_runs.h"
#include "runtime/cpu/simd_clones.h"
#include "runtime/nan_propagating.h"

namespace meshfuse::cpu {

// A binary operand: a tile buffer, or (ptr == nullptr) the same scalar for every element.
template <typename T>
struct TileOperand {
  const T* ptr = nullptr;
  T scalar{};
};

namespace detail {
// Always inlined, so that each SIMD clone of the apply functions below has its own wide loop
// (an out-of-line callee would be built for the baseline only).
template <typename T, typename F>
[[gnu::always_inline]] inline void mapUnary(const T* __restrict x, T* __restrict out, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) out[i] = f(x[i]);
}

template <typename T, typename F>
[[gnu::always_inline]] inline void mapBinary(TileOperand<T> a, TileOperand<T> b, T* __restrict out, int64_t n, F f) {
  const T* __restrict pa = a.ptr;
  const T* __restrict pb = b.ptr;
  if (pa && pb) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(pa[i], pb[i]);
  } else if (pb) {
    const T sa = a.scalar;
    for (int64_t i = 0; i < n; ++i) out[i] = f(sa, pb[i]);
  } else if (pa) {
    const T sb = b.scalar;
    for (int64_t i = 0; i < n; ++i) out[i] = f(pa[i], sb);
  } else {
    const T v = f(a.scalar, b.scalar);
    for (int64_t i = 0; i < n; ++i) out[i] = v;
  }
}
}  // namespace detail

template <typename T>
MESHFUSE_SIMD_CLONES void applyUnary(OpType op, const T* x, T* out, int64_t n) {
  using detail::mapUnary;
  switch (op) {
    case OpType::Neg: return mapUnary(x, out, n, [](T v) { return static_cast<T>(-v); });
    // fabs clears the sign bit: abs(-0.0) is +0.0 (1 / abs(x) is +inf), as numpy and torch give.
    case OpType::Abs:
      return mapUnary(x, out, n, [](T v) {
        if constexpr (std::is_floating_point_v<T>)
          return std::fabs(v);
        else
          return static_cast<T>(v < T(0) ? -v : v);
      });
    // NaN < 0 is false, so relu keeps NaN (as torch does).
    case OpType::Relu: return mapUnary(x, out, n, [](T v) { return v < T(0) ? T(0) : v; });
    case OpType::Exp: return mapUnary(x, out, n, [](T v) { return expOf(v); });
    case OpType::Log: return mapUnary(x, out, n, [](T v) { return static_cast<T>(std::log(v)); });
    case OpType::Sqrt: return mapUnary(x, out, n, [](T v) { return static_cast<T>(std::sqrt(v)); });
    case OpType::Tanh: return mapUnary(x, out, n, [](T v) { return tanhOf(v); });
    case OpType::Sigmoid: return mapUnary(x, out, n, [](T v) { return static_cast<T>(T(1) / (T(1) + expOf<T>(-v))); });
    case OpType::Gelu:  // the exact (erf) form, torch's default
      return mapUnary(x, out, n, [](T v) {
        return static_cast<T>(T(0.5) * v * (T(1) + std::erf(v * static_cast<T>(0.70710678118654752440))));
      });
    case OpType::Rsqrt: return mapUnary(x, out, n, [](T v) { return static_cast<T>(T(1) / std::sqrt(v)); });
    case OpType::Reciprocal: return mapUnary(x, out, n, [](T v) { return static_cast<T>(T(1) / v); });
    case OpType::Erf: return mapUnary(x, out, n, [](T v) { return static_cast<T>(std::erf(v)); });
    case OpType::Silu: return mapUnary(x, out, n, [](T v) { return static_cast<T>(v / (T(1) + expOf<T>(-v))); });
    case OpType::Square: return mapUnary(x, out, n, [](T v) { return static_cast<T>(v * v); });
    case OpType::LogicalNot: return mapUnary(x, out, n, [](T v) { return static_cast<T>(v == T(0)); });
    case OpType::Set: std::memcpy(out, x, static_cast<size_t>(n) * sizeof(T)); return;
    default: break;
  }
  throw std::logic_error("applyUnary: " + toString(op) + " is not a unary op");
}

template <typename T>
MESHFUSE_SIMD_CLONES void applyBinary(OpType op, TileOperand<T> a, TileOperand<T> b, T* out, int64_t n) {
  using detail::mapBinary;
  switch (op) {
    case OpType::Add: return mapBinary(a, b, out, n, [](T x, T y) { return static_cast<T>(x + y); });
    case OpType::Sub: return mapBinary(a, b, out, n, [](T x, T y) { return static_cast<T>(x - y); });
    case OpType::Mul: return mapBinary(a, b, out, n, [](T x, T y) { return static_cast<T>(x * y); });
    case OpType::Div: return mapBinary(a, b, out, n, [](T x, T y) { return static_cast<T>(x / y); });
    // maximum/minimum propagate NaN from either side (runtime/nan_propagating.h).
    case OpType::Max: return mapBinary(a, b, out, n, [](T x, T y) { return nanPropagatingMax(x, y); });
    case OpType::Min: return mapBinary(a, b, out, n, [](T x, T y) { return nanPropagatingMin(x, y); });
    case OpType::Pow: return mapBinary(a, b, out, n, [](T x, T y) { return static_cast<T>(std::pow(x, y)); });
    // Comparisons and logical ops yield 0 or 1 in T; the Bool result stores them as bytes.
    case OpType::Lt: return mapBinary(a, b, out, n, [](T x, T y) { return static_cast<T>(x < y); });
    case OpType::Le: return mapBinary(a, b, out, n, [](T x, T y) { return static_cast<T>(x <= y); });
    case OpType::Gt: return mapBinary(a, b, out, n, [](T x, T y) { return static_cast<T>(x > y); });
    case OpType::Ge: return mapBinary(a, b, out, n, [](T x, T y) { return static_cast<T>(x >= y); });
    case OpType::Eq: return mapBinary(a, b, out, n, [](T x, T y) { return static_cast<T>(x == y); });
    case OpType::Ne: return mapBinary(a, b, out, n, [](T x, T y) { return static_cast<T>(x != y); });
    case OpType::LogicalAnd:
      return mapBinary(a, b, out, n, [](T x, T y) { return static_cast<T>(x != T(0) && y != T(0)); });
    case OpType::LogicalOr:
      return mapBinary(a, b, out, n, [](T x, T y) { return static_cast<T>(x != T(0) || y != T(0)); });
    default: break;
  }
  throw std::logic_error("applyBinary: " + toString(op) + " is not a binary op");
}

// where(c, a, b) over tiles: c is 0/1 (a loaded Bool) in T; any operand may be a scalar.
template <typename T>
MESHFUSE_SIMD_CLONES void applyWhere(TileOperand<T> c, TileOperand<T> a, TileOperand<T> b, T* __restrict out,
                                     int64_t n) {
  auto at = [](const TileOperand<T>& o, int64_t i) { return o.ptr ? o.ptr[i] : o.scalar; };
  if (c.ptr && a.ptr && b.ptr) {
    const T* __restrict pc = c.ptr;
    const T* __restrict pa = a.ptr;
    const T* __restrict pb = b.ptr;
    for (int64_t i = 0; i < n; ++i) out[i] = pc[i] != T(0) ? pa[i] : pb[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = at(c, i) != T(0) ? at(a, i) : at(b, i);
}

// out[i] = x[i] rounded to storage type S and read back as T, for i < n; `out` may be `x`. Float
// through Half and BFloat16 take the vectorized runs (half_runs.h), as a cast to them runs over
// every element (specializations below: a call in an `if constexpr` branch on T was checked by
// clang for T = double too, where it does not exist).
template <typename S, typename T>
void roundThroughRun(const T* x, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Elem<S>::template load<T>(Elem<S>::template store<T>(x[i]));
}
template <>
inline void roundThroughRun<HalfBits, float>(const float* x, float* out, int64_t n) {
  roundThroughHalfRun(x, out, n);
}
template <>
inline void roundThroughRun<BFloat16Bits, float>(const float* x, float* out, int64_t n) {
  roundThroughBf16Run(x, out, n);
}

// out[i] = x[i] rounded to `dtype` and read back as T (a cast inside a fused computation).
// `out` may be `x`.
template <typename T>
MESHFUSE_SIMD_CLONES void applyRounding(DataType dtype, const T* x, T* out, int64_t n) {
  dispatchStorage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    if constexpr (std::is_same_v<S, T>) {
      if (out != x) std::memcpy(out, x, static_cast<size_t>(n) * sizeof(T));
    } else {
      roundThroughRun<S, T>(x, out, n);
    }
  });
}

}  // namespace meshfuse::cpu

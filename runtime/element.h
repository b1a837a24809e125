// Reading and writing one element of any DataType as a double: the slow, general path used by
// copies between dtypes, tests and debugging (kernels have their own typed loops).
#pragma once
#include <cmath>
#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/half.h"

namespace meshfuse {

inline double loadAsDouble(const void* p, DataType dtype) {
  switch (dtype) {
    case DataType::Float: return *static_cast<const float*>(p);
    case DataType::Double: return *static_cast<const double*>(p);
    case DataType::Half: return halfToFloat(*static_cast<const uint16_t*>(p));
    case DataType::BFloat16: return bf16ToFloat(*static_cast<const uint16_t*>(p));
    case DataType::Int: return static_cast<double>(*static_cast<const int64_t*>(p));
    case DataType::Int32: return *static_cast<const int32_t*>(p);
    case DataType::Bool: return *static_cast<const uint8_t*>(p) != 0 ? 1.0 : 0.0;
  }
  return 0;
}

inline void storeFromDouble(void* p, DataType dtype, double v) {
  switch (dtype) {
    case DataType::Float: *static_cast<float*>(p) = static_cast<float>(v); break;
    case DataType::Double: *static_cast<double*>(p) = v; break;
    case DataType::Half: *static_cast<uint16_t*>(p) = floatToHalf(static_cast<float>(v)); break;
    case DataType::BFloat16: *static_cast<uint16_t*>(p) = floatToBf16(static_cast<float>(v)); break;
    case DataType::Int: *static_cast<int64_t*>(p) = static_cast<int64_t>(v); break;
    case DataType::Int32: *static_cast<int32_t*>(p) = static_cast<int32_t>(v); break;
    case DataType::Bool: *static_cast<uint8_t*>(p) = v != 0.0 ? 1 : 0; break;
  }
}

// `v` as an element of `dtype` holds it, back as a double: a number rounded to Float, Half or
// BFloat16, a Bool's 0 or 1 (any non-zero, NaN included, is true, as numpy's bool(0.5)), an integer
// truncated toward zero. Integers out of range (which callers reject first) are held to the
// range and NaN is 0, so that the conversion is always defined.
inline double representedAs(DataType dtype, double v) {
  switch (dtype) {
    case DataType::Bool: return v != 0.0 ? 1.0 : 0.0;
    case DataType::Int:
    case DataType::Int32: {
      if (std::isnan(v)) return 0.0;
      const double lo = dtype == DataType::Int32 ? -2147483648.0 : -9223372036854775808.0;
      const double hi = dtype == DataType::Int32 ? 2147483647.0 : 9223372036854774784.0;
      return std::trunc(std::fmin(std::fmax(v, lo), hi));
    }
    default: {
      alignas(8) unsigned char element[8];
      storeFromDouble(element, dtype, v);
      return loadAsDouble(element, dtype);
    }
  }
}

}  // namespace meshfuse

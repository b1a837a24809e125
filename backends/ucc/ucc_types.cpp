#include "backends/ucc/ucc_types.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>

namespace meshfuse::ucc {

ucc_datatype_t datatypeFor(DataType dtype) {
  switch (dtype) {
    case DataType::Float: return UCC_DT_FLOAT32;
    case DataType::Double: return UCC_DT_FLOAT64;
    case DataType::Half: return UCC_DT_FLOAT16;
    case DataType::BFloat16: return UCC_DT_BFLOAT16;
    case DataType::Int: return UCC_DT_INT64;
    case DataType::Int32: return UCC_DT_INT32;
    case DataType::Bool: return UCC_DT_UINT8;
  }
  throw std::invalid_argument("ucc backend: no UCC datatype for " + toString(dtype));
}

ucc_reduction_op_t opFor(ReduceOp op, DataType dtype) {
  if (dtype == DataType::Bool) return (op == ReduceOp::Sum || op == ReduceOp::Max) ? UCC_OP_MAX : UCC_OP_MIN;
  switch (op) {
    case ReduceOp::Sum: return UCC_OP_SUM;
    case ReduceOp::Prod: return UCC_OP_PROD;
    case ReduceOp::Max: return UCC_OP_MAX;
    case ReduceOp::Min: return UCC_OP_MIN;
  }
  throw std::invalid_argument("ucc backend: unknown reduce op " + toString(op));
}

bool reducesWidened(DataType dtype, ucc_memory_type_t memory) {
  return dtype == DataType::Half && memory == UCC_MEMORY_TYPE_HOST;
}

bool reducesOnOrderedKeys(DataType dtype, ReduceOp op, ucc_memory_type_t memory) {
  return isFloatingPoint(dtype) && (op == ReduceOp::Max || op == ReduceOp::Min) && memory == UCC_MEMORY_TYPE_HOST;
}

DataType orderedKeyDtype(DataType dtype) { return dtype == DataType::Double ? DataType::Int : DataType::Int32; }

namespace {
// A signed integer in the order of the float whose bits it holds: non-negative floats keep their bits
// (larger bits, larger value); negative ones have their 31 (63) magnitude bits flipped, so a larger
// magnitude gives a smaller key, and -0 sits just below +0. The map is its own inverse.
template <typename Int>
Int flipNegative(Int bits) {
  return bits >= 0 ? bits : static_cast<Int>(bits ^ std::numeric_limits<Int>::max());
}

template <typename Float, typename Int>
void toKeys(const Float* values, Int* keys, int64_t n, bool nan_high) {
  // A NaN made positive (above +inf) for max, negative (below -inf) for min.
  const Float nan = nan_high ? std::numeric_limits<Float>::quiet_NaN() : -std::numeric_limits<Float>::quiet_NaN();
  for (int64_t i = 0; i < n; ++i) {
    const Float v = std::isnan(values[i]) ? nan : values[i];
    Int bits;
    std::memcpy(&bits, &v, sizeof(bits));
    keys[i] = flipNegative(bits);
  }
}

template <typename Float, typename Int>
void toValues(const Int* keys, Float* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const Int bits = flipNegative(keys[i]);
    std::memcpy(&values[i], &bits, sizeof(bits));
  }
}
}  // namespace

// Half and BFloat16 go through Float, which holds each of their values exactly (a max or min picks
// one of the values, so rounding back is exact too).
Tensor orderedKeys(const Tensor& values, ReduceOp op) {
  Tensor keys = Tensor::empty(values.shape(), orderedKeyDtype(values.dtype()));
  const bool nan_high = op == ReduceOp::Max;
  if (values.dtype() == DataType::Double) {
    toKeys(values.dataAs<double>(), keys.dataAs<int64_t>(), values.numel(), nan_high);
  } else {
    const Tensor floats = values.to(DataType::Float);
    toKeys(floats.dataAs<float>(), keys.dataAs<int32_t>(), values.numel(), nan_high);
  }
  return keys;
}

void fromOrderedKeys(const Tensor& keys, Tensor& values) {
  if (values.dtype() == DataType::Double) {
    toValues(keys.dataAs<int64_t>(), values.dataAs<double>(), values.numel());
  } else if (values.dtype() == DataType::Float) {
    toValues(keys.dataAs<int32_t>(), values.dataAs<float>(), values.numel());
  } else {
    Tensor floats = Tensor::empty(values.shape(), DataType::Float);
    toValues(keys.dataAs<int32_t>(), floats.dataAs<float>(), values.numel());
    values.copyFrom(floats);
  }
}

}  // namespace meshfuse::ucc

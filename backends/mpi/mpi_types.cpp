#include "backends/mpi/mpi_types.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "runtime/half.h"
#include "runtime/nan_propagating.h"

namespace meshfuse::mpi {

namespace {

// inout[i] = combine(in[i], inout[i]) on 16-bit floats, computed in float32 and rounded back.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float), typename Combine>
// cppcheck-suppress constParameter ; MPI_User_function's signature: len is an int*
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = FromFloat(Combine{}(ToFloat(a[i]), ToFloat(b[i])));
}

// Bool: sum and max are "any" (logical or), prod and min are "all" (logical and).
template <bool Or>
// cppcheck-suppress constParameter ; MPI_User_function's signature: len is an int*
void reduceBool(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint8_t*>(in);
  auto* b = static_cast<uint8_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = Or ? (a[i] != 0 || b[i] != 0) : (a[i] != 0 && b[i] != 0);
}

struct Add {
  float operator()(float a, float b) const { return a + b; }
};
struct Mul {
  float operator()(float a, float b) const { return a * b; }
};
struct Max {
  float operator()(float a, float b) const { return nanPropagatingMax(a, b); }
};
struct Min {
  float operator()(float a, float b) const { return nanPropagatingMin(a, b); }
};

// Max and min of float and double where NaN wins: MPI_MAX / MPI_MIN compare, so they keep or drop a
// NaN by the order the ranks' values meet in.
template <typename T, bool IsMax>
// cppcheck-suppress constParameter ; MPI_User_function's signature: len is an int*
void reduceNanPropagating(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = IsMax ? nanPropagatingMax(a[i], b[i]) : nanPropagatingMin(a[i], b[i]);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
struct Ops16 {
  MPI_Op ops[4];  // indexed by ReduceOp
  Ops16() {
    MPI_Op_create(&reduce16<ToFloat, FromFloat, Add>, 1, &ops[0]);
    MPI_Op_create(&reduce16<ToFloat, FromFloat, Mul>, 1, &ops[1]);
    MPI_Op_create(&reduce16<ToFloat, FromFloat, Max>, 1, &ops[2]);
    MPI_Op_create(&reduce16<ToFloat, FromFloat, Min>, 1, &ops[3]);
  }
};

struct Registry {
  MPI_Datatype half, bfloat16, boolean;
  Ops16<halfToFloat, floatToHalf> half_ops;
  Ops16<bf16ToFloat, floatToBf16> bf16_ops;
  MPI_Op bool_or, bool_and;
  MPI_Op float_max, float_min, double_max, double_min;
  Registry() {
    // Distinct types (not MPI_UINT16_T) so no predefined integer op is applied to them by mistake.
    MPI_Type_contiguous(2, MPI_BYTE, &half);
    MPI_Type_commit(&half);
    MPI_Type_contiguous(2, MPI_BYTE, &bfloat16);
    MPI_Type_commit(&bfloat16);
    MPI_Type_contiguous(1, MPI_BYTE, &boolean);
    MPI_Type_commit(&boolean);
    MPI_Op_create(&reduceBool<true>, 1, &bool_or);
    MPI_Op_create(&reduceBool<false>, 1, &bool_and);
    MPI_Op_create(&reduceNanPropagating<float, true>, 1, &float_max);
    MPI_Op_create(&reduceNanPropagating<float, false>, 1, &float_min);
    MPI_Op_create(&reduceNanPropagating<double, true>, 1, &double_max);
    MPI_Op_create(&reduceNanPropagating<double, false>, 1, &double_min);
  }
};

const Registry& registry() {
  // Leaked on purpose: a static destructor would run after MPI_Finalize.
  static const Registry* r = new Registry();
  return *r;
}

}  // namespace

MPI_Datatype datatypeFor(DataType dtype) {
  switch (dtype) {
    case DataType::Float: return MPI_FLOAT;
    case DataType::Double: return MPI_DOUBLE;
    case DataType::Half: return registry().half;
    case DataType::BFloat16: return registry().bfloat16;
    case DataType::Int: return MPI_INT64_T;
    case DataType::Int32: return MPI_INT32_T;
    case DataType::Bool: return registry().boolean;
  }
  throw std::invalid_argument("mpi backend: no MPI datatype for " + toString(dtype));
}

MPI_Op opFor(ReduceOp op, DataType dtype) {
  const auto index = static_cast<size_t>(op);
  switch (dtype) {
    case DataType::Half: return registry().half_ops.ops[index];
    case DataType::BFloat16: return registry().bf16_ops.ops[index];
    case DataType::Bool: return (op == ReduceOp::Sum || op == ReduceOp::Max) ? registry().bool_or : registry().bool_and;
    case DataType::Float:
      if (op == ReduceOp::Max) return registry().float_max;
      if (op == ReduceOp::Min) return registry().float_min;
      break;
    case DataType::Double:
      if (op == ReduceOp::Max) return registry().double_max;
      if (op == ReduceOp::Min) return registry().double_min;
      break;
    default: break;
  }
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Prod: return MPI_PROD;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  throw std::invalid_argument("mpi backend: unknown reduce op " + toString(op));
}

}  // namespace meshfuse::mpi

#include "backends/ucc/ucc_types.h"

#include <stdexcept>

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

}  // namespace meshfuse::ucc

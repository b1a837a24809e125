// UCC datatypes and reduction ops for every meshfuse DataType.
//   Float, Double, Int, Int32, BFloat16: UCC's own types and ops (FLOAT32, FLOAT64, INT64, INT32,
//     BFLOAT16; UCC's CPU reduction computes bfloat16 in float and rounds back).
//   Half: UCC_DT_FLOAT16, but UCC's CPU executor has no float16 reduction kernels (ec/cpu: "not
//     supported"), so reductions of Half in host memory run on a Float copy and are rounded back
//     once at the end (see reducesWidened); data movement and CUDA memory use FLOAT16 directly.
//   Bool: UCC has no boolean type; meshfuse's Bool is one byte holding 0 or 1, which travels as
//     UINT8, and its reductions are logical or (sum, max) and and (prod, min): on 0/1 bytes those
//     are UCC_OP_MAX and UCC_OP_MIN, which every UCC executor has (UCC_OP_LOR/LAND are not in all).
#pragma once
#include <ucc/api/ucc.h>

#include "backends/backend.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace meshfuse::ucc {

ucc_datatype_t datatypeFor(DataType dtype);
ucc_reduction_op_t opFor(ReduceOp op, DataType dtype);
// Whether a reduction of `dtype` in `memory` must run on a Float copy (Half on the host).
bool reducesWidened(DataType dtype, ucc_memory_type_t memory);

// Max and min of the floating types on the host: UCC's CPU kernels compare, so a NaN was kept or
// dropped by the order the ranks' values met in. They run instead on integer keys ordered as the
// values are (Int for Double; Int32 for Float, and for Half and BFloat16 through Float), NaN above
// +inf for max and below -inf for min, whose integer max / min UCC computes exactly; the result is
// turned back into values.
bool reducesOnOrderedKeys(DataType dtype, ReduceOp op, ucc_memory_type_t memory);
DataType orderedKeyDtype(DataType dtype);
Tensor orderedKeys(const Tensor& values, ReduceOp op);  // contiguous values -> a new tensor of keys
void fromOrderedKeys(const Tensor& keys, Tensor& values);

}  // namespace meshfuse::ucc

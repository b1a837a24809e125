// The element-wise reduction Gloo calls while it reduces: out[i] = a[i] (op) b[i] for n elements
// (out may alias a or b). Gloo's own functions cover only its types; meshfuse needs every
// DataType x ReduceOp, with 16-bit floats computed in float32 and Bool as logic (sum and max are
// "any", prod and min are "all"), matching the MPI backend.
#pragma once
#include <cstddef>

#include "backends/backend.h"
#include "runtime/dtype.h"

namespace meshfuse::gloo_backend {

using ReduceFunction = void (*)(void* out, const void* a, const void* b, size_t n);

ReduceFunction reduceFunctionFor(DataType dtype, ReduceOp op);

}  // namespace meshfuse::gloo_backend

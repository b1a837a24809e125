// A contiguous copy of a tensor of any strides in another dtype, converted tile by tile over all
// threads (Tensor::to goes element by element through double on one thread).
#pragma once
#include "runtime/tensor.h"

namespace meshfuse::cpu {

Tensor convertToContiguous(const Tensor& src, DataType dtype);

}  // namespace meshfuse::cpu

// A same-dtype copy between CUDA tensors whose innermost axis is contiguous on both sides (a
// permute that keeps the last axis, such as attention's [b, h, s, d] -> [b, s, h, d] head merge, a
// column slice, or a part of a concatenation written into its slice of the result, as the
// transformer backward's dq, dk and dv are): 16 bytes per thread and step, index arithmetic once
// per 16 bytes in 32-bit where the extents allow. The generic path (a one-op pointwise kernel)
// computes a 64-bit multi-index per element (70 us for each of those three 50 MB parts on the
// H100, about 1.4 TB/s). CUDA-free header.
#pragma once
#include <string>

#include "runtime/tensor.h"

namespace meshfuse::cuda {

// Copies and returns true when the layouts qualify (same dtype and device, the last axis contiguous
// on both sides, every byte offset a multiple of 16, at most 6 axes after merging, not both
// dense); returns false, having done nothing, otherwise.
bool tryVectorizedCopy(const Tensor& dst, const Tensor& src);

// The kernel's source (for the code generation tests).
std::string vectorizedCopySource();

}  // namespace meshfuse::cuda

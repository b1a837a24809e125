// A same-dtype copy into a contiguous CUDA tensor from a strided one whose innermost axis is
// contiguous (a permute that keeps the last axis, such as attention's [b, h, s, d] -> [b, s, h, d]
// head merge, or a column slice): 16 bytes per thread and step, index arithmetic once per 16 bytes
// in 32-bit where the extents allow. The generic path (a one-op pointwise kernel) computes a
// 64-bit multi-index per element. CUDA-free header.
#pragma once
#include <string>

#include "runtime/tensor.h"

namespace meshfuse::cuda {

// Copies and returns true when the layouts qualify (same dtype and device, `dst` contiguous, the
// source's last axis contiguous and every byte offset a multiple of 16, at most 6 axes after
// merging); returns false, having done nothing, otherwise.
bool tryVectorizedCopy(const Tensor& dst, const Tensor& src);

// The kernel's source (for the code generation tests).
std::string vectorizedCopySource();

}  // namespace meshfuse::cuda

// The CUDA caching allocator's statistics (the allocator itself is reached through
// allocatorFor(Device::cuda(i)) in runtime/tensor.h). CUDA-free header.
#pragma once
#include <cstdint>

namespace meshfuse::cuda {

// Bytes of live tensors on `device` allocated through meshfuse (for leak tests).
int64_t bytesInUse(int device);
// Bytes the device's pool holds, in use or cached for reuse.
int64_t bytesReserved(int device);

}  // namespace meshfuse::cuda

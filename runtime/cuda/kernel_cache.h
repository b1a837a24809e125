// Run-time compilation of generated CUDA C++ with NVRTC, and the cache of compiled kernels: a
// source is compiled once per (key, GPU architecture) and its module loaded once per device.
// CUDA-free header (kernels are handed around as opaque cudaKernel_t handles).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "runtime/cuda/streams.h"

namespace meshfuse::cuda {

// The CUDA include directory NVRTC needs for cuda_fp16.h / cuda_bf16.h: $CUDA_HOME, $CUDA_PATH,
// then /usr/local/cuda. Throws std::runtime_error naming the places it looked.
std::string cudaIncludeDir();

// Compiles `source` to a cubin for `arch` (such as "sm_90"); throws with NVRTC's log on failure.
std::string compileToCubin(const std::string& source, const std::string& program_name, const std::string& arch);

// "sm_<major><minor>" of a device.
std::string deviceArch(int device);
int multiprocessorCount(int device);
int computeCapabilityMajor(int device);  // 9 for sm_90 (cached, as multiprocessorCount)

using KernelFunction = void*;  // a cudaKernel_t

// The kernel `name` from the source that `make_source` builds, for `device`, compiled on first use.
KernelFunction cachedKernel(int device, const std::string& key, const std::function<std::string()>& make_source,
                            const std::string& name);

// Launches on `stream`; `params` points to the kernel's single by-value parameter (its struct).
void launchKernel(KernelFunction kernel, unsigned grid, unsigned block, Stream stream, void* params,
                  unsigned dynamic_shared_bytes = 0, unsigned grid_y = 1, unsigned block_y = 1);

// Launches a grid of thread-block clusters of `cluster` blocks along x (sm_90; grid % cluster == 0),
// with block_y rows of threads per block.
void launchClusterKernel(KernelFunction kernel, unsigned grid, unsigned block, unsigned block_y, unsigned cluster,
                         Stream stream, void* params);

// NVRTC compilations so far (tests check that a repeated execution compiles nothing).
int64_t kernelCompilations();

}  // namespace meshfuse::cuda

// Error checking for the CUDA runtime, NVRTC and cuBLASLt calls of runtime/cuda/ and the
// CUDA backends: a failing call throws std::runtime_error naming the call, the error and the place.
// Internal header (it includes the CUDA headers); public headers of runtime/cuda/ stay CUDA-free.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nvrtc.h>

#include <stdexcept>
#include <string>

namespace meshfuse::cuda {

[[noreturn]] inline void throwCudaError(const char* what, const std::string& error, const char* file, int line) {
  throw std::runtime_error(std::string(what) + " failed: " + error + " (" + file + ":" + std::to_string(line) + ")");
}

}  // namespace meshfuse::cuda

#define MESHFUSE_CUDA_CHECK(call)                                                                     \
  do {                                                                                                \
    cudaError_t meshfuse_err_ = (call);                                                               \
    if (meshfuse_err_ != cudaSuccess)                                                                 \
      ::meshfuse::cuda::throwCudaError(#call, cudaGetErrorString(meshfuse_err_), __FILE__, __LINE__); \
  } while (0)

#define MESHFUSE_NVRTC_CHECK(call)                                                                     \
  do {                                                                                                 \
    nvrtcResult meshfuse_err_ = (call);                                                                \
    if (meshfuse_err_ != NVRTC_SUCCESS)                                                                \
      ::meshfuse::cuda::throwCudaError(#call, nvrtcGetErrorString(meshfuse_err_), __FILE__, __LINE__); \
  } while (0)

#define MESHFUSE_CUBLAS_CHECK(call)                                                                          \
  do {                                                                                                       \
    cublasStatus_t meshfuse_err_ = (call);                                                                   \
    if (meshfuse_err_ != CUBLAS_STATUS_SUCCESS)                                                              \
      ::meshfuse::cuda::throwCudaError(#call,                                                                \
                                       std::string("cublas status ") + std::to_string(meshfuse_err_) + " " + \
                                           cublasLtGetStatusString(meshfuse_err_),                           \
                                       __FILE__, __LINE__);                                                  \
  } while (0)

#include "backends/ucc/ucc_memory.h"

#include <stdexcept>

#if MESHFUSE_HAVE_CUDA && MESHFUSE_UCC_CUDA
#include <cuda_runtime_api.h>

#include "runtime/cuda/streams.h"
#endif

namespace meshfuse::ucc {

bool carries(Device device) {
  if (device.type == DeviceType::CPU) return true;
  return MESHFUSE_HAVE_CUDA && MESHFUSE_UCC_CUDA;
}

ucc_memory_type_t memoryTypeOf(const Tensor& t) {
  return t.device().type == DeviceType::CUDA ? UCC_MEMORY_TYPE_CUDA : UCC_MEMORY_TYPE_HOST;
}

void checkCarries(const std::string& op, const char* name, const Tensor& t) {
  if (!t.defined() || carries(t.device())) return;
  throw std::invalid_argument(op + ": " + name + " is on " + t.device().toString() +
                              ", but this UCC build carries host memory only (UCC was built without CUDA: build "
                              "it with scripts/build-ucc --cuda), or use the mpi backend, which stages CUDA "
                              "tensors through host memory");
}

void readyForUcc(const Tensor& t) {
#if MESHFUSE_HAVE_CUDA && MESHFUSE_UCC_CUDA
  if (!t.defined() || t.device().type != DeviceType::CUDA) return;
  const cudaError_t e = cudaStreamSynchronize(cuda::currentStream(t.device().index));
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("ucc backend: cudaStreamSynchronize: ") + cudaGetErrorString(e));
#else
  (void)t;
#endif
}

}  // namespace meshfuse::ucc

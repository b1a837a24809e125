// Which memory this UCC build carries, and making a tensor's bytes ready for UCC. Host memory
// always; CUDA memory only when UCC itself was built with CUDA (its mc/ec cuda components, known
// to CMake as MESHFUSE_UCC_CUDA) and meshfuse with CUDA. A CUDA tensor is otherwise an error
// before any communication, naming the way out.
#pragma once
#include <ucc/api/ucc.h>

#include <string>

#include "runtime/tensor.h"

namespace meshfuse::ucc {

bool carries(Device device);
ucc_memory_type_t memoryTypeOf(const Tensor& t);
// Throws std::invalid_argument "`op`: `name` is on cuda:0, which ..." when carries() is false.
void checkCarries(const std::string& op, const char* name, const Tensor& t);
// UCC reads CUDA memory from its own streams: work queued on the tensor's current stream (the
// kernel that made it) must be done first. Nothing to do for host memory.
void readyForUcc(const Tensor& t);

}  // namespace meshfuse::ucc

// Fused attention on CUDA through cuDNN's frontend graph API (SDPA forward and backward). CUDA-free
// header. In a build without cuDNN (or its frontend headers) runAttention throws a UserError naming
// what is missing.
#pragma once
#include <vector>

#include "runtime/attention_params.h"
#include "runtime/tensor.h"

namespace meshfuse::cuda {

// Whether this build has cuDNN attention.
bool haveCudnnAttention();

// Runs sdpfa_fwd or sdpfa_bwd expr `e` on `device`, on its current stream. `tensors[i]` is operand
// i (a CUDA tensor; empty for scalar operands) and `p` its parameters (attentionParams; the
// backward's seed/offset are read here from its 0-dim operands). Returns the expr's outputs.
std::vector<Tensor> runAttention(int device, const Expr& e, AttentionParams p, const std::vector<Tensor>& tensors);

}  // namespace meshfuse::cuda

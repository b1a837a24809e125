// The dropout mask of fused attention on CUDA, generated with meshfuse's Philox (runtime/philox.h)
// so that it is the CPU kernel's mask bit for bit: element (b, h, i, j) is 1 where the Philox
// uniform of its global index (AttentionParams::dropoutIndex) is >= dropout_p, else 0. cuDNN's own
// in-kernel dropout derives its mask from Philox in a layout of its own that is not documented,
// so it cannot be matched on the CPU; cuDNN takes this mask as an input instead. CUDA-free header.
#pragma once
#include <string>

#include "runtime/attention_params.h"
#include "runtime/tensor.h"

namespace meshfuse::cuda {

// The mask kernel's CUDA source (NVRTC; exposed for the code generation tests).
std::string dropoutMaskSource();

// A [batch, heads, seq_q, seq_kv] tensor of `dtype` (Half or BFloat16) on `device`, of 0 and 1.
Tensor dropoutMask(int device, const AttentionParams& p, DataType dtype, const void* seed_at = nullptr,
                   const void* offset_at = nullptr);

// A 0-dim Int tensor on `device` holding `value`, written by a one-thread kernel on the current
// stream (a host-to-device copy from pageable memory would synchronize the stream).
Tensor deviceInt64Scalar(int device, int64_t value);
// That kernel's source (for the code generation tests).
std::string storeInt64Source();

}  // namespace meshfuse::cuda

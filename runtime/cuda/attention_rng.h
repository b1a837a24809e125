// Who draws the dropout of fused attention on CUDA (MESHFUSE_ATTENTION_RNG, read at each call):
//   meshfuse (the default): meshfuse's Philox stream, handed to cuDNN as an explicit mask
//     (dropout_mask.h). CPU and CUDA then drop the same elements for the same philox_seed and
//     philox_offset, as the sdpfa tests check; it costs a mask kernel per pass and cuDNN's slower
//     custom-mask kernels (2.7 ms against 0.7 for the GPT-3 layer's attention backward on the H100).
//   cudnn: cuDNN's own generator inside its kernels, seeded by the same philox_seed and
//     philox_offset. The forward and the backward agree with each other (the backward regenerates the
//     forward's mask) and a (seed, offset) pair still gives the same mask on every run, but the mask
//     follows cuDNN's undocumented layout: the CPU kernel cannot draw it, so a fusion run on CPU and on
//     CUDA drops different elements. For training on GPUs only, where that agreement is not needed.
// CUDA-free header.
#pragma once
#include <string>

#include "runtime/attention_params.h"

namespace meshfuse::cuda {

enum class AttentionRng { Meshfuse, Cudnn };

// The environment's choice; UserError naming the accepted values for any other.
AttentionRng attentionRngFromEnvironment();

// UserError when attention `op` with cuDNN's generator would run on a shard of the heads or the
// batch: cuDNN draws by local position, so every shard (every tensor-parallel rank, with the same
// seed and offset) would drop the same pattern in its heads, where meshfuse's mask is drawn by
// global position. Raised on every rank alike, before the call.
void checkCudnnRngUnsharded(const AttentionParams& p, const std::string& op);

}  // namespace meshfuse::cuda

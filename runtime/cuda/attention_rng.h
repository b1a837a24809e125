// Who draws the dropout of fused attention on CUDA (MESHFUSE_ATTENTION_RNG, read at each call):
//   cudnn (the default since session 22): cuDNN's own generator inside its kernels, seeded by the
//     op's philox_seed and philox_offset, as torch's SDPA and nvFuser's sdpfa_fwd draw theirs. The
//     forward and the backward agree with each other (the backward regenerates the forward's mask)
//     and a (seed, offset) pair gives the same mask on every run, but the mask follows cuDNN's
//     undocumented layout: the CPU kernel cannot draw it, so a fusion run on CPU and on CUDA drops
//     different elements, and tensor-parallel shards draw masks of their own (cudnnShardKey), as
//     Megatron's model-parallel generator does.
//   meshfuse: meshfuse's Philox stream, handed to cuDNN as an explicit mask (dropout_mask.h). CPU and
//     CUDA then drop the same elements for the same philox_seed and philox_offset, whatever the
//     sharding, as the sdpfa tests check (they pin it); it costs a mask kernel per pass and cuDNN's
//     slower custom-mask kernels (2.7 ms against 0.8 for the GPT-3 layer's attention backward on the
//     H100, whichever of cuDNN's plans runs: attention_plans.h), about 10% of the layer's step. It was
//     the default until session 22.
// CUDA-free header.
#pragma once
#include <cstdint>
#include <string>
#include <utility>

#include "runtime/attention_params.h"
#include "runtime/tensor.h"

namespace meshfuse::cuda {

enum class AttentionRng { Meshfuse, Cudnn };

// The environment's choice; UserError naming the accepted values for any other.
AttentionRng attentionRngFromEnvironment();

// The key of attention block `p`'s shard for cuDNN's generator: 0 on the whole tensor and on the shard
// that holds its first (batch, head), else that shard's first global (batch, head) index. cuDNN draws
// by local position, so shards given one seed would all drop the same pattern in their heads
// (meshfuse's own mask is drawn by global position and needs none of this).
uint64_t cudnnShardKey(const AttentionParams& p);

// The seed cuDNN is given for the shard of key `key`: `seed` itself for key 0, else a splitmix64 mix
// of the two, so that every shard draws its own mask. The masks then depend on how the heads are
// sharded (cuDNN's mask is not the CPU's either: the price of MESHFUSE_ATTENTION_RNG=cudnn). The
// backward derives it again from the forward's seed, so both passes drop the same elements.
inline uint64_t mixShardSeed(uint64_t seed, uint64_t key) {
  if (key == 0) return seed;
  uint64_t z = seed + key * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The seed and offset words cuDNN's generator reads for the shard of key `key`: 16-byte aligned 0-dim
// device views of one four-word buffer, written by one one-thread kernel on the current stream from
// the device words `seed_at` / `offset_at` (the backward's philox inputs, read without waiting for
// the kernels that write them) or, where those are null, from `seed` / `offset`. With key 0 and no
// device words these are the forward's philox outputs (dropout_mask.h's devicePhiloxScalars).
std::pair<Tensor, Tensor> cudnnPhiloxWords(int device, const void* seed_at, const void* offset_at, uint64_t seed,
                                           uint64_t offset, uint64_t key);
// That kernel's source (for the code generation tests).
std::string philoxWordsSource();

}  // namespace meshfuse::cuda

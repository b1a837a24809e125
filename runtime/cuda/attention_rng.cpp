#include "runtime/cuda/attention_rng.h"

#include <cstdlib>
#include <string>

#include "ir/ir.h"

namespace meshfuse::cuda {

AttentionRng attentionRngFromEnvironment() {
  const char* e = std::getenv("MESHFUSE_ATTENTION_RNG");
  const std::string v = e == nullptr ? "" : e;
  if (v.empty() || v == "meshfuse") return AttentionRng::Meshfuse;
  if (v == "cudnn") return AttentionRng::Cudnn;
  throw UserError("MESHFUSE_ATTENTION_RNG=" + v +
                  " is not one of meshfuse (the default: CPU and CUDA drop the same elements) and cudnn (cuDNN's "
                  "in-kernel dropout: faster on CUDA, a mask the CPU cannot draw)");
}

void checkCudnnRngUnsharded(const AttentionParams& p, const std::string& op) {
  if (!p.sharded) return;
  throw UserError(op + " with MESHFUSE_ATTENTION_RNG=cudnn on sharded heads or batch (this rank holds " +
                  std::to_string(p.heads) + " of " + std::to_string(p.global_heads) +
                  " heads): cuDNN draws its dropout by local position, so every shard would drop the same elements; "
                  "unset MESHFUSE_ATTENTION_RNG (meshfuse's mask is drawn by global position) or run attention "
                  "unsharded");
}

}  // namespace meshfuse::cuda

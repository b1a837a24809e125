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

}  // namespace meshfuse::cuda

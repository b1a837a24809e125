// What one fused-attention call needs besides its tensors, shared by the CPU kernel
// (runtime/cpu/attention.cpp) and the cuDNN one (runtime/cuda/attention.cpp).
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/segment.h"

namespace meshfuse {

struct AttentionParams {
  int64_t batch = 0, heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0, head_dim_v = 0;  // local extents
  double scale = 0;     // resolved: 1/sqrt(head_dim) when the op's scale was None
  bool causal = false;  // top-left aligned (key j is seen by query i iff j <= i), as torch's is_causal
  double dropout_p = 0;
  uint64_t seed = 0, offset = 0;
  // Where the local (batch, head) block sits in the global tensor, so that a sharded run drops the
  // same elements as an unsharded one (the dropout mask is indexed by global position).
  int64_t batch_offset = 0, head_offset = 0, global_heads = 0;
  bool sharded = false;  // this call holds a part of the batch or of the heads, not all of them

  // The global index g of probability element (b, h, i, j) of the local block: its uniform is word
  // g % 4 of Philox counter g / 4 (runtime/philox.h).
  uint64_t dropoutIndex(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const uint64_t gb = static_cast<uint64_t>(b + batch_offset), gh = static_cast<uint64_t>(h + head_offset);
    return ((gb * static_cast<uint64_t>(global_heads) + gh) * static_cast<uint64_t>(seq_q) + static_cast<uint64_t>(i)) *
               static_cast<uint64_t>(seq_kv) +
           static_cast<uint64_t>(j);
  }
};

// What a kept element is multiplied by under dropout: 1 / (1 - p). One definition for the CPU kernel
// and the CUDA mask, which must scale by the same float.
inline double dropoutKeepScale(double dropout_p) { return 1.0 / (1.0 - dropout_p); }

// The op's scale operand: NaN (None) means 1/sqrt(head_dim).
inline double resolveScale(double scale, int64_t head_dim) {
  return std::isnan(scale) ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : scale;
}

// The parameters of attention expr `e` (sdpfa_fwd or sdpfa_bwd) at local shapes q, k, v, its
// scalar operands read through `scalar`, and the global block of its first output (nullptr: not
// sharded). The forward's seed/offset come from its scalars; the backward's (tensors) are left to
// the caller.
AttentionParams attentionParams(const Expr& e, const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                                const std::vector<int64_t>& v, const std::function<double(const Val*)>& scalar,
                                const GlobalBlock* block);

}  // namespace meshfuse

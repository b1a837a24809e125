#include "runtime/attention_params.h"

#include "ops/attention.h"

namespace meshfuse {

AttentionParams attentionParams(const Expr& e, const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                                const std::vector<int64_t>& v, const std::function<double(const Val*)>& scalar,
                                const GlobalBlock* block) {
  using namespace ops::sdpa;
  const bool fwd = e.op() == OpType::SdpaFwd;
  AttentionParams p;
  p.batch = q[0];
  p.heads = q[1];
  p.seq_q = q[2];
  p.seq_kv = k[2];
  p.head_dim = q[3];
  p.head_dim_v = v[3];
  p.dropout_p = scalar(e.input(fwd ? size_t{kDropoutP} : size_t{kBwdDropoutP}));
  if (!(p.dropout_p >= 0 && p.dropout_p < 1))
    throw UserError(toString(e.op()) + ": dropout_p must be in [0, 1), got " + std::to_string(p.dropout_p));
  p.causal = scalar(e.input(fwd ? size_t{kIsCausal} : size_t{kBwdIsCausal})) != 0;
  p.scale = resolveScale(scalar(e.input(fwd ? size_t{kScale} : size_t{kBwdScale})), p.head_dim);
  if (fwd) {
    p.seed = static_cast<uint64_t>(scalar(e.input(kSeed)));
    p.offset = static_cast<uint64_t>(scalar(e.input(kOffset)));
  }
  p.global_heads = p.heads;
  if (block) {
    p.batch_offset = block->offsets[0];
    p.head_offset = block->offsets[1];
    p.global_heads = block->global_shape[1];
    p.sharded = block->global_shape[0] != p.batch || block->global_shape[1] != p.heads;
  }
  return p;
}

}  // namespace meshfuse

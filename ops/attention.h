// Fused scaled dot-product attention, nvFuser's sdpfa_fwd / sdpfa_bwd: one expr each, with several
// outputs. q, k, v are [b, h, s, d] (s_q may differ from s_kv; v's head dim may differ from q's);
// log_sumexp is [b, h, s_q] Float (natural log of the softmax denominator of the scaled scores).
//
// Dropout is counter-based (Philox 4x32-10, runtime/philox.h): element (b, h, i, j) of the global
// [B, H, S_q, S_kv] probability matrix is kept iff uniform(index g = ((b*H + h)*S_q + i)*S_kv + j,
// offset, seed) >= dropout_p (the 24-bit uniform of word g % 4 of Philox counter g / 4), i.e.
// exactly where fd.ops.uniform(0, 1, [B, H, S_q, S_kv], rng_seed=seed, rng_offset=offset) >= dropout_p. philox_seed and
// philox_offset are returned as 0-dim Int tensors (nvFuser returns scalar tensors too) so the backward can take them as
// inputs and a sharded run keeps them replicated; each execution of a forward draws a fresh pair.
#pragma once
#include <array>

#include "ir/ir.h"

namespace meshfuse::ops {

// Operand positions of the two exprs (Scalars after the tensors; seed/offset last in the forward,
// where the executor binds a fresh pair per execution as for uniform()).
namespace sdpa {
enum Fwd : size_t { kQ = 0, kK, kV, kDropoutP, kIsCausal, kScale, kSeed, kOffset };
enum Bwd : size_t {
  kBwdGradOut = 0,
  kBwdQ,
  kBwdK,
  kBwdV,
  kBwdOut,
  kBwdLse,
  kBwdDropoutP,
  kBwdIsCausal,
  kBwdSeed,
  kBwdOffset,
  kBwdScale
};
}  // namespace sdpa

struct SdpaFwdResult {
  TensorView* out;
  TensorView* log_sumexp;
  TensorView* philox_seed;
  TensorView* philox_offset;
};

// dropout_p, is_causal, scale: Scalars or nullptr (0, false, 1/sqrt(d)). A scale constant of NaN
// also means 1/sqrt(d) (how "None" is recorded when d is symbolic at definition time).
SdpaFwdResult sdpfaFwd(TensorView* q, TensorView* k, TensorView* v, Val* dropout_p, Val* is_causal, Val* scale);
// Returns (grad_q, grad_k, grad_v).
std::array<TensorView*, 3> sdpfaBwd(TensorView* grad_out, TensorView* q, TensorView* k, TensorView* v, TensorView* out,
                                    TensorView* log_sumexp, Val* dropout_p, Val* is_causal, TensorView* philox_seed,
                                    TensorView* philox_offset, Val* scale);

// Every output's shape from the operands' shapes (-1 = unknown), checking ranks and extents; throws
// UserError naming the op, the tensors and the axes.
std::vector<std::vector<int64_t>> attentionShapes(OpType op, const std::vector<Val*>& inputs,
                                                  const std::vector<std::vector<int64_t>>& shapes);

}  // namespace meshfuse::ops

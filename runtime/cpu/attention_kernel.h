// Flash-style attention for one (batch, head) on the CPU, in compute type T (float or double):
// a tile of queries against tiles of keys with an online softmax (running max and sum), the tile
// products through BLAS, and never an [s_q, s_kv] buffer: memory is O(tile * (tile + d)) per
// thread beyond the O(s * d) inputs and outputs. The backward (flash-attention-2) recomputes the
// probability tiles from log_sumexp. Internal to runtime/cpu/.
#pragma once
#include <cstdint>

#include "runtime/attention_params.h"

namespace meshfuse::cpu {

// Row-major matrices of one head: q [s_q, d], k [s_kv, d], v [s_kv, d_v], o [s_q, d_v], each with
// its own row stride (ld*, in elements: a head's rows may be rows of a wider tensor, as the heads of
// a fused qkv projection or an output written heads-inner are), and lse [s_q]. (b, h) is the head's
// local position, for the dropout counter.
template <typename T>
struct HeadPointers {
  const T* q;
  const T* k;
  const T* v;
  T* o;
  T* lse;
  int64_t b, h;
  int64_t ldq, ldk, ldv, ldo;
};

template <typename T>
void attentionForwardHead(const AttentionParams& p, const HeadPointers<T>& head);

// grad_q/k/v [same shapes as q/k/v] from grad_out and out [s_q, d_v] and lse [s_q], each with its
// row stride.
template <typename T>
struct HeadGradPointers {
  const T* grad_out;
  const T* out;
  T* grad_q;
  T* grad_k;
  T* grad_v;
  int64_t ld_grad_out, ld_out, ld_grad_q, ld_grad_k, ld_grad_v;
};

template <typename T>
void attentionBackwardHead(const AttentionParams& p, const HeadPointers<T>& head, const HeadGradPointers<T>& grads);

}  // namespace meshfuse::cpu

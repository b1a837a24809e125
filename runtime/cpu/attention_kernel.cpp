#include "runtime/cpu/attention_kernel.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/cpu/aligned_buffer.h"
#include "runtime/cpu/fast_exp.h"
#include "runtime/cpu/philox_block.h"
#include "runtime/cpu/simd_clones.h"
#include "runtime/philox.h"

namespace meshfuse::cpu {

namespace {

// Tile extents: a [64, 128] score tile (32 KiB in fp32) and its partners stay in L2 beside the
// K/V tiles, and the products are large enough for BLAS to run near its peak.
constexpr int64_t kTileQ = 64;
constexpr int64_t kTileK = 128;

// C[m, n] = alpha * op(A) @ op(B) + beta * C, row-major.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

// Keys of the tile starting at j0 (of `bk`) that query i sees: all, or those with j <= i (causal).
int64_t visibleKeys(const AttentionParams& p, int64_t i, int64_t j0, int64_t bk) {
  return p.causal ? std::clamp<int64_t>(i - j0 + 1, 0, bk) : bk;
}

// z[c] = keep where word c's uniform is >= threshold, else 0: one vectorized pass over a row's words.
template <typename T>
MESHFUSE_SIMD_CLONES void keepMultipliers(const uint32_t* __restrict w, int64_t n, float threshold, T keep,
                                          T* __restrict z) {
  for (int64_t c = 0; c < n; ++c) z[c] = philox::unitFloat(w[c]) >= threshold ? keep : T(0);
}

// The dropout multipliers of a [bq, bk] tile: 1/(1-p) where the element is kept, else 0. Kept
// means the element's Philox uniform (fd.ops.uniform's, Float precision: word g % 4 of counter
// g / 4, runtime/philox.h) is >= dropout_p. The counters of all the tile's rows are drawn in one
// block (philox_block.h: vectorized), a row's from the one holding its first element (which may sit
// mid-counter) to the one holding its last visible element; keys a causal row does not see get 0
// without a draw past that counter (their probabilities are 0: no element's number changes, and
// the diagonal tiles draw 12-20% fewer words).
template <typename T>
void dropoutTile(const AttentionParams& p, int64_t b, int64_t h, int64_t i0, int64_t j0, int64_t bq, int64_t bk, T* z) {
  constexpr int64_t kRowCounters = kTileK / 4 + 2;  // a row of bk elements starting mid-counter
  struct alignas(kCacheLine) Scratch {
    uint64_t counter[kTileQ * kRowCounters];
    uint32_t words[4 * kTileQ * kRowCounters];
    int64_t row_word[kTileQ];  // where the row's first element's word sits in `words`
  };
  thread_local Scratch scratch;
  const float threshold = static_cast<float>(p.dropout_p);
  const T keep = static_cast<T>(dropoutKeepScale(p.dropout_p));
  int64_t count = 0;
  for (int64_t r = 0; r < bq; ++r) {
    const int64_t visible = visibleKeys(p, i0 + r, j0, bk);
    if (visible == 0) continue;
    const uint64_t base = p.dropoutIndex(b, h, i0 + r, j0);
    const uint64_t first = base / 4, n = (base + static_cast<uint64_t>(visible) - 1) / 4 - first + 1;
    consecutiveCounters(first, static_cast<int64_t>(n), scratch.counter + count);
    scratch.row_word[r] = 4 * count + static_cast<int64_t>(base % 4);
    count += static_cast<int64_t>(n);
  }
  philoxWords(scratch.counter, count, p.offset, p.seed, scratch.words);
  for (int64_t r = 0; r < bq; ++r) {
    const int64_t visible = visibleKeys(p, i0 + r, j0, bk);
    const uint32_t* w = scratch.words + (visible > 0 ? scratch.row_word[r] : 0);
    keepMultipliers<T>(w, visible, threshold, keep, z + r * bk);
    std::fill(z + r * bk + visible, z + (r + 1) * bk, T(0));
  }
}

// The largest of x[0, n) and init. An OpenMP simd reduction, so that GCC vectorizes it without
// -ffast-math (a plain running max is a serial dependency it must not reorder; perf showed the
// earlier eight-lane array version running as scalar vmaxss, a fifth of the forward's row time).
template <typename T>
[[gnu::always_inline]] inline T rowMax(const T* __restrict x, int64_t n, T init) {
  T mx = init;
#pragma omp simd reduction(max : mx)
  for (int64_t c = 0; c < n; ++c) mx = x[c] > mx ? x[c] : mx;
  return mx;
}

// x[c] = e^(x[c] - shift) for c < n, returning their sum; then, with z, x[c] *= z[c] (the dropout
// multipliers, after the sum: the normalizer sums the probabilities before dropout). One pass.
template <typename T>
[[gnu::always_inline]] inline T expShiftSum(T* __restrict x, const T* __restrict z, int64_t n, T shift) {
  T sum = 0;
  if (z == nullptr) {
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < n; ++c) {
      x[c] = expOf<T>(x[c] - shift);
      sum += x[c];
    }
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < n; ++c) {
      const T e = expOf<T>(x[c] - shift);
      sum += e;
      x[c] = e * z[c];
    }
  }
  return sum;
}

// One step of the online softmax over a [bq, bk] score tile: per row, the running max m and
// normalizer l take in the tile's scores, the row becomes exp(score - m) (times the dropout
// multipliers z, after l has summed it), and acc (the rows' output so far; null when only the
// log-sum-exp is wanted) is rescaled by e^(old m - new m).
template <typename T>
MESHFUSE_SIMD_CLONES void onlineSoftmaxTile(const AttentionParams& p, int64_t i0, int64_t j0, int64_t bq, int64_t bk,
                                            int64_t dv, T* s, const T* z, T* m, T* l, T* acc) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < bq; ++r) {
    T* row = s + r * bk;
    const int64_t visible = visibleKeys(p, i0 + r, j0, bk);
    const T mx = rowMax(row, visible, m[r]);
    if (mx == kNegInf) {  // no key seen yet by this row
      std::fill(row, row + bk, T(0));
      continue;
    }
    const T alpha = expOf<T>(m[r] - mx);  // rescales what earlier tiles summed
    const T sum = expShiftSum(row, acc != nullptr && z != nullptr ? z + r * bk : nullptr, visible, mx);
    std::fill(row + visible, row + bk, T(0));
    l[r] = l[r] * alpha + sum;
    m[r] = mx;
    if (acc == nullptr || alpha == T(1)) continue;
#pragma omp simd
    for (int64_t c = 0; c < dv; ++c) acc[r * dv + c] *= alpha;
  }
}

// The probabilities of a [bq, bk] score tile from the rows' log-sum-exp: s = exp(s - lse).
template <typename T>
MESHFUSE_SIMD_CLONES void probabilitiesFromLse(const AttentionParams& p, int64_t i0, int64_t j0, int64_t bq, int64_t bk,
                                               const T* lse, T* s) {
  for (int64_t r = 0; r < bq; ++r) {
    T* row = s + r * bk;
    const int64_t visible = visibleKeys(p, i0 + r, j0, bk);
    const T shift = lse[i0 + r];
#pragma omp simd
    for (int64_t c = 0; c < visible; ++c) row[c] = expOf<T>(row[c] - shift);
    std::fill(row + visible, row + bk, T(0));
  }
}

// pd[e] = s[e] * z[e]: the dropped probabilities of a tile.
template <typename T>
MESHFUSE_SIMD_CLONES void multiplyInto(const T* __restrict s, const T* __restrict z, int64_t n, T* __restrict pd) {
  for (int64_t e = 0; e < n; ++e) pd[e] = s[e] * z[e];
}

// dS = P * (dP * z - D) over a [bq, bk] tile, in place in dp (z: dropout multipliers or null).
template <typename T>
MESHFUSE_SIMD_CLONES void scoreGradTile(int64_t i0, int64_t bq, int64_t bk, const T* s, const T* z, const T* dsum,
                                        T* dp) {
  for (int64_t r = 0; r < bq; ++r) {
    const T di = dsum[i0 + r];
    const T* __restrict sr = s + r * bk;
    T* __restrict dr = dp + r * bk;
    if (z != nullptr) {
      const T* __restrict zr = z + r * bk;
      for (int64_t c = 0; c < bk; ++c) dr[c] = sr[c] * (dr[c] * zr[c] - di);
    } else {
      for (int64_t c = 0; c < bk; ++c) dr[c] = sr[c] * (dr[c] - di);
    }
  }
}

// x [rows, cols] (row stride ld) as a dense [cols, rows]. A product with a key tile transposed (S = Q K^T, dP = dO V^T)
// then runs as a plain NN product of K^T's or V^T's columns: OpenBLAS 0.3.21 takes its small-matrix
// kernel for NN at the tile shapes (64 x 128 x 64: 7-8 us) and its general, packing path for NT
// (10-14 us), on this Xeon. One transposition per head (OpenBLAS's omatcopy: 8 us for [512, 64],
// a blocked loop took 21-25), against O(s^2 d) of products.
AlignedVector<float> transposed(const float* x, int64_t rows, int64_t cols, int64_t ld) {
  AlignedVector<float> t(static_cast<size_t>(rows * cols));
  if (rows == 0 || cols == 0) return t;  // OpenBLAS calls an empty matrix an illegal argument (and prints so)
  cblas_somatcopy(CblasRowMajor, CblasTrans, static_cast<int>(rows), static_cast<int>(cols), 1.0f, x,
                  static_cast<int>(ld), t.data(), static_cast<int>(rows));
  return t;
}
AlignedVector<double> transposed(const double* x, int64_t rows, int64_t cols, int64_t ld) {
  AlignedVector<double> t(static_cast<size_t>(rows * cols));
  if (rows == 0 || cols == 0) return t;
  cblas_domatcopy(CblasRowMajor, CblasTrans, static_cast<int>(rows), static_cast<int>(cols), 1.0, x,
                  static_cast<int>(ld), t.data(), static_cast<int>(rows));
  return t;
}

// Zeroes `rows` rows of `cols` elements, `ld` apart.
template <typename T>
void zeroRows(T* x, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) std::fill(x + r * ld, x + r * ld + cols, T(0));
}

}  // namespace

// head.v == nullptr: only log_sumexp is computed (the Double backward recomputes it exactly).
template <typename T>
void attentionForwardHead(const AttentionParams& p, const HeadPointers<T>& head) {
  const int64_t sq = p.seq_q, skv = p.seq_kv, d = p.head_dim, dv = p.head_dim_v;
  const bool values = head.v != nullptr;
  const bool dropout = values && p.dropout_p > 0;
  const T scale = static_cast<T>(p.scale);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  AlignedVector<T> s(kTileQ * kTileK), z(dropout ? kTileQ * kTileK : 0), acc(values ? kTileQ * dv : 0);
  AlignedVector<T> m(kTileQ), l(kTileQ);
  const AlignedVector<T> kt = transposed(head.k, skv, d, head.ldk);
  for (int64_t i0 = 0; i0 < sq; i0 += kTileQ) {
    const int64_t bq = std::min(kTileQ, sq - i0);
    std::fill(m.begin(), m.end(), kNegInf);
    std::fill(l.begin(), l.end(), T(0));
    std::fill(acc.begin(), acc.end(), T(0));
    // Causal: key tiles past the tile's last query are fully masked and skipped.
    const int64_t j_end = p.causal ? std::min(skv, i0 + bq) : skv;
    for (int64_t j0 = 0; j0 < j_end; j0 += kTileK) {
      const int64_t bk = std::min(kTileK, j_end - j0);
      gemm(false, false, bq, bk, d, scale, head.q + i0 * head.ldq, head.ldq, kt.data() + j0, skv, T(0), s.data(), bk);
      if (dropout) dropoutTile(p, head.b, head.h, i0, j0, bq, bk, z.data());
      onlineSoftmaxTile<T>(p, i0, j0, bq, bk, dv, s.data(), dropout ? z.data() : nullptr, m.data(), l.data(),
                           values ? acc.data() : nullptr);
      // The normalizer l sums the probabilities before dropout; the values see the dropped ones.
      if (values)
        gemm(false, false, bq, dv, bk, T(1), s.data(), bk, head.v + j0 * head.ldv, head.ldv, T(1), acc.data(), dv);
    }
    for (int64_t r = 0; r < bq; ++r) {
      head.lse[i0 + r] = m[r] + std::log(l[r]);
      if (!values) continue;
      // A row that saw no key (an empty key sequence) attends to nothing: zeros, not 0 / 0.
      const T inv = l[r] > T(0) ? T(1) / l[r] : T(0);
      for (int64_t c = 0; c < dv; ++c) head.o[(i0 + r) * head.ldo + c] = acc[r * dv + c] * inv;
    }
  }
}

// Flash-attention-2's backward: for each key tile (its dK, dV rows accumulate in place), the query
// tiles that see it recompute P = exp(S - lse); D = rowsum(dO * O) stands for rowsum(P * dP).
template <typename T>
void attentionBackwardHead(const AttentionParams& p, const HeadPointers<T>& head, const HeadGradPointers<T>& g) {
  const int64_t sq = p.seq_q, skv = p.seq_kv, d = p.head_dim, dv = p.head_dim_v;
  const bool dropout = p.dropout_p > 0;
  const T scale = static_cast<T>(p.scale);
  AlignedVector<T> s(kTileQ * kTileK), dp(kTileQ * kTileK), pd(dropout ? kTileQ * kTileK : 0),
      z(dropout ? kTileQ * kTileK : 0), dsum(sq);
  for (int64_t i = 0; i < sq; ++i) {
    T acc = 0;
    for (int64_t c = 0; c < dv; ++c) acc += g.grad_out[i * g.ld_grad_out + c] * g.out[i * g.ld_out + c];
    dsum[i] = acc;
  }
  const AlignedVector<T> kt = transposed(head.k, skv, d, head.ldk), vt = transposed(head.v, skv, dv, head.ldv);
  zeroRows(g.grad_q, sq, d, g.ld_grad_q);
  zeroRows(g.grad_k, skv, d, g.ld_grad_k);
  zeroRows(g.grad_v, skv, dv, g.ld_grad_v);
  for (int64_t j0 = 0; j0 < skv; j0 += kTileK) {
    const int64_t bk = std::min(kTileK, skv - j0);
    T* dk = g.grad_k + j0 * g.ld_grad_k;
    T* dvv = g.grad_v + j0 * g.ld_grad_v;
    // Causal: queries before j0 see none of these keys.
    for (int64_t i0 = p.causal ? j0 : 0; i0 < sq; i0 += kTileQ) {
      const int64_t bq = std::min(kTileQ, sq - i0);
      // Causal: the tile's keys past its last query are masked for all of its rows, so the products
      // stop there (the diagonal query tile of a key tile twice as wide does half the work).
      const int64_t kv = p.causal ? std::min(bk, i0 + bq - j0) : bk;
      gemm(false, false, bq, kv, d, scale, head.q + i0 * head.ldq, head.ldq, kt.data() + j0, skv, T(0), s.data(), kv);
      probabilitiesFromLse<T>(p, i0, j0, bq, kv, head.lse, s.data());
      const T* probs = s.data();
      if (dropout) {
        dropoutTile(p, head.b, head.h, i0, j0, bq, kv, z.data());
        multiplyInto<T>(s.data(), z.data(), bq * kv, pd.data());
        probs = pd.data();
      }
      const T* go = g.grad_out + i0 * g.ld_grad_out;
      gemm(true, false, kv, dv, bq, T(1), probs, kv, go, g.ld_grad_out, T(1), dvv, g.ld_grad_v);
      gemm(false, false, bq, kv, dv, T(1), go, g.ld_grad_out, vt.data() + j0, skv, T(0), dp.data(), kv);
      scoreGradTile<T>(i0, bq, kv, s.data(), dropout ? z.data() : nullptr, dsum.data(), dp.data());  // dS
      gemm(true, false, kv, d, bq, scale, dp.data(), kv, head.q + i0 * head.ldq, head.ldq, T(1), dk, g.ld_grad_k);
      gemm(false, false, bq, d, kv, scale, dp.data(), kv, head.k + j0 * head.ldk, head.ldk, T(1),
           g.grad_q + i0 * g.ld_grad_q, g.ld_grad_q);
    }
  }
}

template void attentionForwardHead<float>(const AttentionParams&, const HeadPointers<float>&);
template void attentionForwardHead<double>(const AttentionParams&, const HeadPointers<double>&);
template void attentionBackwardHead<float>(const AttentionParams&, const HeadPointers<float>&,
                                           const HeadGradPointers<float>&);
template void attentionBackwardHead<double>(const AttentionParams&, const HeadPointers<double>&,
                                            const HeadGradPointers<double>&);

}  // namespace meshfuse::cpu

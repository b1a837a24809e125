// Attention segments (sdpfa_fwd, sdpfa_bwd) on the CPU: operands read in place where they hold the
// compute type (float; double for Double) with contiguous rows, as the heads of a fused qkv
// projection do, else converted to contiguous copies (Half and BFloat16 through float); then one
// flash-style kernel call per (batch, head), the heads spread over OpenMP threads
// (attention_kernel.cpp). The forward writes o heads-inner ([b, s, h, d] memory), so that merging
// the heads is a view; the backward writes dq, dk, dv at q's, k's and v's places in one buffer when
// they are heads of one projection (attention_layout.h), so that concatenating them is a view.
#include "ops/attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <vector>

#include "runtime/attention_layout.h"
#include "runtime/cpu/attention_kernel.h"
#include "runtime/cpu/convert.h"
#include "runtime/cpu/cpu_kernels.h"

namespace meshfuse::cpu {

namespace {

Tensor asContiguous(const Tensor& t, DataType dtype) {
  return t.isContiguous() && t.dtype() == dtype ? t : convertToContiguous(t, dtype);
}

// A [b, h, s, d] operand as the kernel reads it: itself when it holds `dtype` with contiguous rows
// (any outer strides), else a contiguous copy in `dtype`.
Tensor rowsInPlace(const Tensor& t, DataType dtype) {
  bool in_place = t.dtype() == dtype && t.dim() == 4 && (t.strides()[3] == 1 || t.size(3) == 1) &&
                  (t.size(2) == 1 || t.strides()[2] >= t.size(3));
  for (int64_t d = 0; in_place && d < t.dim(); ++d) in_place = t.strides()[d] >= 0;
  return in_place ? t : convertToContiguous(t, dtype);
}

// Head bh (= b * heads + h) of a [b, h, s, d] tensor from rowsInPlace, and its row stride.
template <typename T>
T* headOf(const Tensor& t, int64_t bh, int64_t heads) {
  return t.dataAs<T>() + (bh / heads) * t.strides()[0] + (bh % heads) * t.strides()[1];
}
int64_t rowStride(const Tensor& t) { return t.size(2) > 1 ? t.strides()[2] : std::max<int64_t>(1, t.size(3)); }

// Runs f(i) for i in [0, n): heads in parallel, each with single-threaded BLAS, when there are
// several; otherwise one head at a time with BLAS's own threads.
template <typename F>
void forEachHead(int64_t n, F&& f) {
  if (n < 2 || omp_get_max_threads() < 2) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  const int blas_threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) f(i);
  openblas_set_num_threads(blas_threads);
}

AttentionParams paramsOf(const Segment& seg, const Expr& e, const ValueMap& values, const Tensor& q, const Tensor& k,
                         const Tensor& v) {
  auto block = seg.global_blocks.find(e.out());
  return attentionParams(
      e, q.shape(), k.shape(), v.shape(), [&](const Val* s) { return values.scalar(s); },
      block == seg.global_blocks.end() ? nullptr : &block->second);
}

Tensor scalarTensor(int64_t value) {
  Tensor t = Tensor::empty({}, DataType::Int);
  t.dataAs<int64_t>()[0] = value;
  return t;
}

// Binds `t` (computed in the compute type) as output `tv`, converted to its dtype.
void bindOutput(ValueMap& values, const TensorView* tv, const Tensor& t) {
  values.tensors[tv] = t.dtype() == tv->dtype() ? t : convertToContiguous(t, tv->dtype());
}

template <typename T>
void runForward(const Segment& seg, const Expr& e, ValueMap& values, const ShapeMap& shapes) {
  using namespace ops::sdpa;
  const DataType ct = std::is_same_v<T, double> ? DataType::Double : DataType::Float;
  const Tensor q = rowsInPlace(inputTensor(values, shapes, e.input(kQ)), ct);
  const Tensor k = rowsInPlace(inputTensor(values, shapes, e.input(kK)), ct);
  const Tensor v = rowsInPlace(inputTensor(values, shapes, e.input(kV)), ct);
  const AttentionParams p = paramsOf(seg, e, values, q, k, v);
  Tensor out = Tensor::empty({p.batch, p.seq_q, p.heads, p.head_dim_v}, ct).permute({0, 2, 1, 3});  // heads-inner
  Tensor lse = Tensor::empty({p.batch, p.heads, p.seq_q}, ct);
  forEachHead(p.batch * p.heads, [&](int64_t bh) {
    HeadPointers<T> head{headOf<T>(q, bh, p.heads),
                         headOf<T>(k, bh, p.heads),
                         headOf<T>(v, bh, p.heads),
                         headOf<T>(out, bh, p.heads),
                         lse.dataAs<T>() + bh * p.seq_q,
                         bh / p.heads,
                         bh % p.heads,
                         rowStride(q),
                         rowStride(k),
                         rowStride(v),
                         rowStride(out)};
    attentionForwardHead<T>(p, head);
  });
  bindOutput(values, static_cast<TensorView*>(e.outputs()[0]), out);
  bindOutput(values, static_cast<TensorView*>(e.outputs()[1]), lse);
  values.tensors[e.outputs()[2]] = scalarTensor(static_cast<int64_t>(p.seed));
  values.tensors[e.outputs()[3]] = scalarTensor(static_cast<int64_t>(p.offset));
}

int64_t scalarOf(const Tensor& t, const Val* v, OpType op) {
  if (t.numel() != 1 || t.dtype() != DataType::Int)
    throw UserError(toString(op) + ": " + v->name() + " must be a 0-dim Int tensor, got " + t.toString());
  return t.dataAs<int64_t>()[0];
}

template <typename T>
void runBackward(const Segment& seg, const Expr& e, ValueMap& values, const ShapeMap& shapes) {
  using namespace ops::sdpa;
  const DataType ct = std::is_same_v<T, double> ? DataType::Double : DataType::Float;
  auto in = [&](size_t i) { return rowsInPlace(inputTensor(values, shapes, e.input(i)), ct); };
  const Tensor grad_out = in(kBwdGradOut), q = in(kBwdQ), k = in(kBwdK), v = in(kBwdV), out = in(kBwdOut);
  AttentionParams p = paramsOf(seg, e, values, q, k, v);
  p.seed = static_cast<uint64_t>(
      scalarOf(inputTensor(values, shapes, e.input(kBwdSeed)).contiguous(), e.input(kBwdSeed), e.op()));
  p.offset = static_cast<uint64_t>(
      scalarOf(inputTensor(values, shapes, e.input(kBwdOffset)).contiguous(), e.input(kBwdOffset), e.op()));
  // Float: the forward's log_sumexp as given. Double: recomputed in double per head (the Float
  // log_sumexp would limit the gradients to float accuracy, and finite-difference checks need more).
  const bool exact_lse = std::is_same_v<T, double>;
  Tensor lse = exact_lse ? Tensor::empty({p.batch, p.heads, p.seq_q}, ct)
                         : asContiguous(inputTensor(values, shapes, e.input(kBwdLse)), ct);
  // dq, dk, dv at q's, k's and v's places in one buffer when they are heads of one projection.
  std::vector<Tensor> grads;
  const bool convert = static_cast<const TensorView*>(e.outputs()[0])->dtype() != ct;
  if (auto buffer = convert ? std::nullopt : gradientBufferLike(q, k, v))
    grads = gradientViews(*buffer, q, k, v, ct, Device::cpu());
  else
    grads = {Tensor::empty(q.shape(), ct), Tensor::empty(k.shape(), ct), Tensor::empty(v.shape(), ct)};
  const Tensor &gq = grads[0], &gk = grads[1], &gv = grads[2];
  forEachHead(p.batch * p.heads, [&](int64_t bh) {
    HeadPointers<T> head{headOf<T>(q, bh, p.heads),
                         headOf<T>(k, bh, p.heads),
                         headOf<T>(v, bh, p.heads),
                         nullptr,
                         lse.dataAs<T>() + bh * p.seq_q,
                         bh / p.heads,
                         bh % p.heads,
                         rowStride(q),
                         rowStride(k),
                         rowStride(v),
                         0};
    if (exact_lse) {
      HeadPointers<T> stats = head;
      stats.v = nullptr;
      attentionForwardHead<T>(p, stats);
    }
    HeadGradPointers<T> g{headOf<T>(grad_out, bh, p.heads),
                          headOf<T>(out, bh, p.heads),
                          headOf<T>(gq, bh, p.heads),
                          headOf<T>(gk, bh, p.heads),
                          headOf<T>(gv, bh, p.heads),
                          rowStride(grad_out),
                          rowStride(out),
                          rowStride(gq),
                          rowStride(gk),
                          rowStride(gv)};
    attentionBackwardHead<T>(p, head, g);
  });
  bindOutput(values, static_cast<TensorView*>(e.outputs()[0]), gq);
  bindOutput(values, static_cast<TensorView*>(e.outputs()[1]), gk);
  bindOutput(values, static_cast<TensorView*>(e.outputs()[2]), gv);
}

}  // namespace

void runAttention(const Segment& seg, ValueMap& values, const ShapeMap& shapes) {
  const Expr& e = soleExpr(seg);
  const bool wide = e.input(e.op() == OpType::SdpaFwd ? size_t{ops::sdpa::kQ} : size_t{ops::sdpa::kBwdQ})->dtype() ==
                    DataType::Double;
  if (e.op() == OpType::SdpaFwd) {
    wide ? runForward<double>(seg, e, values, shapes) : runForward<float>(seg, e, values, shapes);
  } else if (e.op() == OpType::SdpaBwd) {
    wide ? runBackward<double>(seg, e, values, shapes) : runBackward<float>(seg, e, values, shapes);
  } else {
    throw std::logic_error("CPU executor: an attention segment holds " + toString(e.op()));
  }
}

}  // namespace meshfuse::cpu

// Attention segments (sdpfa_fwd, sdpfa_bwd) on the CPU: operands made contiguous in the compute
// type (float; double for Double; Half and BFloat16 through float), then one flash-style kernel
// call per (batch, head), the heads spread over OpenMP threads (attention_kernel.cpp).
#include "ops/attention.h"

#include <cblas.h>
#include <omp.h>

#include <stdexcept>

#include "runtime/cpu/attention_kernel.h"
#include "runtime/cpu/convert.h"
#include "runtime/cpu/cpu_kernels.h"

namespace meshfuse::cpu {

namespace {

Tensor asContiguous(const Tensor& t, DataType dtype) {
  return t.isContiguous() && t.dtype() == dtype ? t : convertToContiguous(t, dtype);
}

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
  const Tensor q = asContiguous(inputTensor(values, shapes, e.input(kQ)), ct);
  const Tensor k = asContiguous(inputTensor(values, shapes, e.input(kK)), ct);
  const Tensor v = asContiguous(inputTensor(values, shapes, e.input(kV)), ct);
  const AttentionParams p = paramsOf(seg, e, values, q, k, v);
  Tensor out = Tensor::empty({p.batch, p.heads, p.seq_q, p.head_dim_v}, ct);
  Tensor lse = Tensor::empty({p.batch, p.heads, p.seq_q}, ct);
  const T *qd = q.dataAs<T>(), *kd = k.dataAs<T>(), *vd = v.dataAs<T>();
  T *od = out.dataAs<T>(), *ld = lse.dataAs<T>();
  forEachHead(p.batch * p.heads, [&](int64_t bh) {
    HeadPointers<T> head{qd + bh * p.seq_q * p.head_dim,
                         kd + bh * p.seq_kv * p.head_dim,
                         vd + bh * p.seq_kv * p.head_dim_v,
                         od + bh * p.seq_q * p.head_dim_v,
                         ld + bh * p.seq_q,
                         bh / p.heads,
                         bh % p.heads};
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
  auto in = [&](size_t i) { return asContiguous(inputTensor(values, shapes, e.input(i)), ct); };
  const Tensor grad_out = in(kBwdGradOut), q = in(kBwdQ), k = in(kBwdK), v = in(kBwdV), out = in(kBwdOut);
  AttentionParams p = paramsOf(seg, e, values, q, k, v);
  p.seed = static_cast<uint64_t>(
      scalarOf(inputTensor(values, shapes, e.input(kBwdSeed)).contiguous(), e.input(kBwdSeed), e.op()));
  p.offset = static_cast<uint64_t>(
      scalarOf(inputTensor(values, shapes, e.input(kBwdOffset)).contiguous(), e.input(kBwdOffset), e.op()));
  // Float: the forward's log_sumexp as given. Double: recomputed in double per head (the Float
  // log_sumexp would limit the gradients to float accuracy, and finite-difference checks need more).
  const bool exact_lse = std::is_same_v<T, double>;
  Tensor lse = exact_lse ? Tensor::empty({p.batch, p.heads, p.seq_q}, ct) : in(kBwdLse);
  Tensor gq = Tensor::empty(q.shape(), ct), gk = Tensor::empty(k.shape(), ct), gv = Tensor::empty(v.shape(), ct);
  forEachHead(p.batch * p.heads, [&](int64_t bh) {
    HeadPointers<T> head{q.dataAs<T>() + bh * p.seq_q * p.head_dim,
                         k.dataAs<T>() + bh * p.seq_kv * p.head_dim,
                         v.dataAs<T>() + bh * p.seq_kv * p.head_dim_v,
                         nullptr,
                         lse.dataAs<T>() + bh * p.seq_q,
                         bh / p.heads,
                         bh % p.heads};
    if (exact_lse) {
      HeadPointers<T> stats = head;
      stats.v = nullptr;
      attentionForwardHead<T>(p, stats);
    }
    HeadGradPointers<T> grads{grad_out.dataAs<T>() + bh * p.seq_q * p.head_dim_v,
                              out.dataAs<T>() + bh * p.seq_q * p.head_dim_v, gq.dataAs<T>() + bh * p.seq_q * p.head_dim,
                              gk.dataAs<T>() + bh * p.seq_kv * p.head_dim,
                              gv.dataAs<T>() + bh * p.seq_kv * p.head_dim_v};
    attentionBackwardHead<T>(p, head, grads);
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

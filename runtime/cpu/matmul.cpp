// Matmul and Linear segments through OpenBLAS. Operands whose last two axes are row-major or
// transposed row-major (any leading dimension) go to sgemm/dgemm as they are, with CblasTrans and
// lda/ldb; other layouts are made contiguous first. 16-bit floats are multiplied in float32,
// integers and bools in an int64 loop. A batch that folds into the rows of A (x[B, S, K] @ w) is
// one gemm call; other batches are one call each. float32 GEMMs go to oneDNN's sgemm instead when
// libmeshfuse is built with it (float_gemm.h).
#include <cblas.h>
#if MESHFUSE_HAVE_DNNL
#include <dnnl.h>
constexpr bool kHaveDnnl = true;
#else
constexpr bool kHaveDnnl = false;
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "runtime/cpu/convert.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/float_gemm.h"
#include "runtime/cpu/strided_space.h"
#include "runtime/matrix_layout.h"

namespace meshfuse::cpu {

namespace {

FloatGemm defaultFloatGemm() {
  const char* env = std::getenv("MESHFUSE_CPU_GEMM");
  if (env && std::strcmp(env, "openblas") == 0) return FloatGemm::OpenBlas;
  // cppcheck-suppress knownConditionTrueFalse ; fixed by the build (MESHFUSE_DNNL), not by the code
  return haveOneDnnGemm() ? FloatGemm::OneDnn : FloatGemm::OpenBlas;
}

std::atomic<FloatGemm>& floatGemmChoice() {
  static std::atomic<FloatGemm> choice{defaultFloatGemm()};
  return choice;
}

// C[M, N] (row stride ldc) = op(A)[M, K] @ op(B)[K, N] (+ C when accumulate).
void gemm(const MatrixLayout& la, const MatrixLayout& lb, int64_t m, int64_t n, int64_t k, const float* a,
          const float* b, float* c, int64_t ldc, bool accumulate) {
#if MESHFUSE_HAVE_DNNL
  if (floatGemm() == FloatGemm::OneDnn) {
    // dnnl_sgemm takes row-major matrices, as cblas_sgemm with CblasRowMajor does.
    const dnnl_status_t status = dnnl_sgemm(la.transposed ? 'T' : 'N', lb.transposed ? 'T' : 'N', m, n, k, 1.0f, a,
                                            la.ld, b, lb.ld, accumulate ? 1.0f : 0.0f, c, ldc);
    if (status != dnnl_success) {
      std::ostringstream what;
      what << "CPU matmul: oneDNN sgemm failed (status " << status << ") on [" << m << ", " << k << "] x [" << k << ", "
           << n << "]";
      throw std::runtime_error(what.str());
    }
    return;
  }
#endif
  cblas_sgemm(CblasRowMajor, la.transposed ? CblasTrans : CblasNoTrans, lb.transposed ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a, static_cast<int>(la.ld), b,
              static_cast<int>(lb.ld), accumulate ? 1.0f : 0.0f, c, static_cast<int>(ldc));
}

void gemm(const MatrixLayout& la, const MatrixLayout& lb, int64_t m, int64_t n, int64_t k, const double* a,
          const double* b, double* c, int64_t ldc, bool accumulate) {
  cblas_dgemm(CblasRowMajor, la.transposed ? CblasTrans : CblasNoTrans, lb.transposed ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, a, static_cast<int>(la.ld), b,
              static_cast<int>(lb.ld), accumulate ? 1.0 : 0.0, c, static_cast<int>(ldc));
}

// Integers: exact int64 arithmetic (BLAS has none), rows in parallel.
void gemm(const MatrixLayout& la, const MatrixLayout& lb, int64_t m, int64_t n, int64_t k, const int64_t* a,
          const int64_t* b, int64_t* c, int64_t ldc, bool accumulate) {
  const int64_t ars = la.transposed ? 1 : la.ld, acs = la.transposed ? la.ld : 1;
  const int64_t brs = lb.transposed ? 1 : lb.ld, bcs = lb.transposed ? lb.ld : 1;
#pragma omp parallel for schedule(static) if (m * n * k >= (1 << 16))
  for (int64_t i = 0; i < m; ++i) {
    int64_t* row = c + i * ldc;
    if (!accumulate) std::fill(row, row + n, int64_t{0});
    for (int64_t p = 0; p < k; ++p) {
      const int64_t av = a[i * ars + p * acs];
      const int64_t* brow = b + p * brs;
      for (int64_t j = 0; j < n; ++j) row[j] += av * brow[j * bcs];
    }
  }
}

Tensor matrixReady(const Tensor& t, DataType compute) {
  const int64_t r = t.dim();
  if (t.dtype() == compute && matrixLayout(t.size(r - 2), t.size(r - 1), t.strides()[r - 2], t.strides()[r - 1]))
    return t;
  return convertToContiguous(t, compute);
}

std::vector<int64_t> batchShape(const Tensor& t) { return {t.shape().begin(), t.shape().end() - 2}; }
std::vector<int64_t> batchStrides(const Tensor& t) { return {t.strides().begin(), t.strides().end() - 2}; }

std::vector<int64_t> broadcastBatch(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> out(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < a.size(); ++i) out[out.size() - a.size() + i] = a[i];
  for (size_t i = 0; i < b.size(); ++i) {
    int64_t& o = out[out.size() - b.size() + i];
    if (o == 1) o = b[i];
  }
  return out;
}

// C (contiguous [batch..., M, N], of type T) = A @ B batched with broadcasting; A is [..., M, K]
// and B [..., K, N], both of type T with BLAS-readable matrices (see matrixReady).
template <typename T>
void batchedMatmul(const Tensor& a, const Tensor& b, T* c, bool accumulate) {
  const int64_t ra = a.dim(), rb = b.dim();
  const int64_t m = a.size(ra - 2), k = a.size(ra - 1), n = b.size(rb - 1);
  if (m == 0 || n == 0) return;
  const std::vector<int64_t> batch = broadcastBatch(batchShape(a), batchShape(b));
  const int64_t batches = numelOf(batch);
  if (k == 0) {
    if (!accumulate) std::fill(c, c + batches * m * n, T(0));
    return;
  }
  const MatrixLayout la = *matrixLayout(m, k, a.strides()[ra - 2], a.strides()[ra - 1]);
  const MatrixLayout lb = *matrixLayout(k, n, b.strides()[rb - 2], b.strides()[rb - 1]);
  StridedSpace space{batch,
                     {broadcastStrides(batchShape(a), batchStrides(a), batch),
                      broadcastStrides(batchShape(b), batchStrides(b), batch)}};
  const T* pa = a.dataAs<const T>();
  const T* pb = b.dataAs<const T>();

  // One call when B is shared by every batch and A's batches stack into one taller matrix.
  bool b_shared = std::all_of(space.strides[1].begin(), space.strides[1].end(), [](int64_t s) { return s == 0; });
  if (b_shared && !la.transposed) {
    StridedSpace rows{batch, {space.strides[0]}};
    rows.shape.push_back(m);
    rows.strides[0].push_back(la.ld);
    rows.coalesce();
    if (rows.rank() == 0 || (rows.rank() == 1 && rows.strides[0][0] >= k)) {
      const int64_t ld = rows.rank() == 0 ? k : rows.strides[0][0];
      gemm(MatrixLayout{false, ld}, lb, batches * m, n, k, pa, pb, c, n, accumulate);
      return;
    }
  }
  std::vector<int64_t> index, offsets;
  for (int64_t i = 0; i < batches; ++i) {
    space.locate(i, index, offsets);
    gemm(la, lb, m, n, k, pa + offsets[0], pb + offsets[1], c + i * m * n, n, accumulate);
  }
}

DataType computeTypeFor(DataType out) {
  if (out == DataType::Double) return DataType::Double;
  if (isFloatingPoint(out)) return DataType::Float;
  return DataType::Int;
}

// Runs C = A @ B (+ bias rows) into `out`, through a compute-typed buffer when `out` has another dtype.
void matmulInto(Tensor a, Tensor b, const Tensor* bias, Tensor& out) {
  const DataType compute = computeTypeFor(out.dtype());
  a = matrixReady(a, compute);
  b = matrixReady(b, compute);
  Tensor c = out.dtype() == compute ? out : Tensor::empty(out.shape(), compute);
  auto run = [&](auto zero) {
    using T = decltype(zero);
    T* pc = c.dataAs<T>();
    const int64_t n = b.size(b.dim() - 1), rows = n ? c.numel() / n : 0;
    Tensor bias_values = bias ? convertToContiguous(*bias, compute) : Tensor();
    const T* pbias = bias ? bias_values.dataAs<const T>() : nullptr;
    const bool scalar_bias = bias && bias_values.numel() == 1;
    // With a bias, C starts as the bias rows and gemm accumulates onto it (beta = 1).
    if (bias) {
#pragma omp parallel for schedule(static) if (rows * n >= (1 << 15))
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n; ++j) pc[r * n + j] = pbias[scalar_bias ? 0 : j];
    }
    batchedMatmul<T>(a, b, pc, bias != nullptr);
  };
  if (compute == DataType::Float)
    run(0.0f);
  else if (compute == DataType::Double)
    run(0.0);
  else
    run(int64_t{0});
  if (c.storage() != out.storage()) out = convertToContiguous(c, out.dtype());
}

// A 2-D view of t with the given shape and strides (no copy).
Tensor view2d(const Tensor& t, int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return Tensor(t.storage(), t.byteOffset(), t.dtype(), {rows, cols}, {rs, cs});
}

void runMatmulExpr(const Expr& e, const ValueMap& values, const ShapeMap& shapes, Tensor& out) {
  Tensor a = inputTensor(values, shapes, e.input(0));
  Tensor b = inputTensor(values, shapes, e.input(1));
  // numpy: a 1-D left operand is a row [1, K], a 1-D right operand a column [K, 1]; the unit axis
  // is then absent from the result, which leaves its contiguous layout unchanged.
  if (a.dim() == 1) a = view2d(a, 1, a.size(0), a.size(0) * a.strides()[0], a.strides()[0]);
  if (b.dim() == 1) b = view2d(b, b.size(0), 1, b.strides()[0], 1);
  matmulInto(a, b, nullptr, out);
}

void runLinearExpr(const Expr& e, const ValueMap& values, const ShapeMap& shapes, Tensor& out) {
  Tensor x = inputTensor(values, shapes, e.input(0));
  const Tensor& w = inputTensor(values, shapes, e.input(1));
  const int64_t k = x.size(x.dim() - 1);
  // x[..., K] as one [R, K] matrix: a view when its leading axes coalesce, else a copy.
  StridedSpace lead{{x.shape().begin(), x.shape().end() - 1}, {{x.strides().begin(), x.strides().end() - 1}}};
  lead.coalesce();
  if (lead.rank() > 1) {
    x = x.contiguous();
    lead = StridedSpace{{numelOf(lead.shape)}, {{k}}};
  }
  const int64_t rows = lead.numel(), row_stride = lead.rank() ? lead.strides[0][0] : k;
  Tensor x2 = view2d(x, rows, k, row_stride, x.strides().back());
  // y = x @ w^T: the transposed weight is a permuted view, which BLAS reads with CblasTrans.
  Tensor wt = w.dim() == 2 ? w.permute({1, 0}) : view2d(w, k, 1, w.strides()[0], 1);
  std::optional<Tensor> bias;
  if (e.inputs().size() > 2) bias = inputTensor(values, shapes, e.input(2));
  matmulInto(x2, wt, bias ? &*bias : nullptr, out);
}

}  // namespace

bool haveOneDnnGemm() { return kHaveDnnl; }

FloatGemm floatGemm() { return floatGemmChoice().load(std::memory_order_relaxed); }

void setFloatGemm(FloatGemm gemm) {
  // cppcheck-suppress knownConditionTrueFalse ; fixed by the build (MESHFUSE_DNNL), not by the code
  if (gemm == FloatGemm::OneDnn && !haveOneDnnGemm())
    throw std::invalid_argument("setFloatGemm: libmeshfuse was built without oneDNN (CMake MESHFUSE_DNNL)");
  floatGemmChoice().store(gemm, std::memory_order_relaxed);
}

void runMatmul(const Segment& seg, ValueMap& values, const ShapeMap& shapes) {
  const Expr& e = soleExpr(seg);
  Tensor& out = allocateOutput(values, shapes, e.out());
  if (e.op() == OpType::Matmul)
    runMatmulExpr(e, values, shapes, out);
  else if (e.op() == OpType::Linear)
    runLinearExpr(e, values, shapes, out);
  else
    throw std::logic_error("CPU matmul: " + toString(e.op()) + " in " + seg.toString());
}

}  // namespace meshfuse::cpu

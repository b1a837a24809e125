// Matrix products on the GPU through cuBLASLt: matmul (numpy semantics: vectors, broadcast batch
// dimensions) and linear (x @ w^T + bias, the bias fused as the CUBLASLT_EPILOGUE_BIAS epilogue).
// bf16 and fp16 accumulate in fp32; fp32 may use TF32 tensor cores; fp64 is exact.
#pragma once
#include "runtime/tensor.h"

namespace meshfuse::cuda {

// `out` is preallocated, contiguous, with the matmul's result shape.
void runMatmul(int device, const Tensor& a, const Tensor& b, const Tensor& out);
// `bias` may be undefined. `out` is preallocated, contiguous, shape [..., N] (or [...] for a rank-1 weight).
void runLinear(int device, const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);

// Row-major C[batch][m][n] = op(A[batch]) @ op(B[batch]) (+ bias[n]). op(A) is [m][k]: A is held
// [m][k] row-major, or [k][m] when trans_a; op(B) is [k][n]: B is [k][n], or [n][k] when trans_b.
// lda/ldb are the held matrices' row strides (0: packed). Batch strides in elements (0 broadcasts).
// The cuBLASLt plan (descriptors and algorithm) is cached per shape, strides, dtype and alignment.
// For large products (MESHFUSE_MATMUL_AUTOTUNE, on by default) the plan's first use times the
// heuristic's best few algorithms on the call's own buffers and keeps the fastest.
struct GemmProblem {
  DataType dtype = DataType::Float;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0;
};
void gemm(int device, const GemmProblem& problem, const void* a, const void* b, void* c, const void* bias);

}  // namespace meshfuse::cuda

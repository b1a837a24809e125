// Matrix products on the GPU through cuBLASLt: matmul (numpy semantics: vectors, broadcast batch
// dimensions) and linear (x @ w^T + bias, the bias fused as the CUBLASLT_EPILOGUE_BIAS epilogue).
// bf16 and fp16 accumulate in fp32; fp32 is fp32 (TF32 tensor cores only with MESHFUSE_MATMUL_TF32=1);
// fp64 is exact.
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

// How many of the heuristic's algorithms autotuning times under a MESHFUSE_MATMUL_AUTOTUNE setting
// (null: unset): 0 for "0" (the first algorithm, untimed), the number for one from 2 up (at most
// 64), else the default 8.
int matmulTuneCandidates(const char* setting);

// What the GEMM applies to the product as it stores C (cuBLASLt epilogues), in row-major terms:
// `bias` [n] is added to every row; `aux` is an [m][n] matrix, rows aux_ld elements apart, of the
// problem's dtype.
struct GemmEpilogue {
  enum class Activation : uint8_t {
    None,
    Gelu,      // C = gelu_tanh(A B + bias); aux (may be null) receives A B + bias, the GELU's input
    GeluGrad,  // C = (A B) * gelu_tanh'(aux): aux holds the GELU's input (no bias)
  };
  Activation activation = Activation::None;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t aux_ld = 0;
  // GeluGrad only, optional: receives C's column sums [n] (DGELU_BGRAD: a linear's bias gradient).
  void* bias_grad = nullptr;
};
// false, with nothing enqueued, when cuBLASLt has no algorithm for the activation epilogue (or the
// problem is batched, or aux_ld is not a multiple of 8): the caller computes it another way. With
// no activation it behaves as gemm() (a bias it cannot fuse is added afterwards).
bool gemmWithEpilogue(int device, const GemmProblem& problem, const void* a, const void* b, void* c,
                      const GemmEpilogue& epilogue);

// A linear (a = x, b = weight [n, k], bias optional) or a 2-D matmul (a @ b) with an activation
// epilogue into `out` (contiguous). Gelu: `aux` (optional, contiguous) receives the GELU's input;
// GeluGrad: `aux` holds it, and `bias_grad` (optional, [n]) receives the column sums of `out`. false where cuBLASLt has
// no such epilogue for the problem (batched products, aux rows not a multiple of 8 elements, no algorithm): nothing is
// computed, and the caller computes it another way.
struct ProductOperands {
  Tensor a, b, bias;
  bool linear = false;
};
bool runProductWithActivation(int device, const ProductOperands& operands, GemmEpilogue::Activation activation,
                              const Tensor& aux, const Tensor& out, const Tensor& bias_grad = Tensor());

// How a GELU-gradient fold (MatmulEpilogue::Kind::GeluTanhGrad) runs on CUDA, from
// MESHFUSE_CUDA_DGELU_EPILOGUE (`off`, `dgelu`, `dgelu_bgrad`; read once, tests set it):
//   Off (default): its exprs after a plain GEMM: one fused pointwise kernel, then the column sum
//     (the bias gradient) reading the bf16 result. On the H100 with cuBLASLt 13.0, DGELU_BGRAD ran
//     as the plain GEMM plus a separate 0.81 ms epilogue kernel over an fp32 copy of the product
//     (GPT-3 layer, [2048 x 49152] bf16), where the pointwise kernel and the sum take 0.28 ms;
//     DGELU alone (a GEMM kernel with the gradient fused, then the sum) tied with the exprs there
//     (3505 us both ways, session 19).
//   Dgelu: the GEMM's DGELU epilogue, then the column sum.
//   DgeluBgrad: DGELU_BGRAD, the bias gradient from the GEMM too.
enum class GeluGradEpilogue : uint8_t { Off, Dgelu, DgeluBgrad };
GeluGradEpilogue geluGradEpilogue();
void setGeluGradEpilogue(GeluGradEpilogue mode);

// Whether fp32 products run on TF32 tensor cores (operands rounded to 10 mantissa bits, fp32
// accumulation): MESHFUSE_MATMUL_TF32 (`0`, the default, or `1`; read once, tests set it). Plans are
// cached per setting.
bool floatMatmulTf32();
void setFloatMatmulTf32(bool on);

// How many GEMMs with an activation epilogue have been enqueued in this process (tests check that
// the epilogue, not its fallback, ran).
int64_t activationEpilogueRuns();

}  // namespace meshfuse::cuda

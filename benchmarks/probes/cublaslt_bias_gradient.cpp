// Probe: what cuBLASLt's bias-gradient epilogue (BGRADB, BGRADA) costs the transformer layer's
// weight-gradient GEMMs. Folding the bias gradient (dy's column sums) into the weight-gradient GEMM
// would save a separate column kernel (31-70 us a linear on the H100); session 23 found the
// epilogue makes the GEMMs 70-320 us slower (0.91-0.94x) and has no algorithm for an fp32 bias
// gradient, and left it off (BENCHMARKS.md, "One H100, session 23").
//
// For each weight gradient of the GPT-3 layer (dW [n, k] = dy^T x over m tokens; bf16 operands and
// output, fp32 compute) it times the plain GEMM and the GEMM with the epilogue, each as the best of
// the heuristic's first 8 algorithms (3 timed launches after one), and checks the first bias
// gradient it gets against a float64 column sum. Built with CUDA (target probe_cublaslt_bias_gradient):
//   build/benchmarks/probe_cublaslt_bias_gradient [tokens [hidden]]     (default 2048 12288)
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cublaslt_probe.h"

namespace {

constexpr int kCandidates = 8;
constexpr int kTimedLaunches = 3;

struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

// One cuBLASLt product D = op(A) op(B) in column-major terms (D [rows, cols], op(A) [rows, depth],
// op(B) [depth, cols]), with an optional epilogue writing `bias`.
struct Product {
  int64_t rows, cols, depth;
  bool transpose_a, transpose_b;
  const void* a;
  const void* b;
  void* d;
  void* bias;
  cublasLtEpilogue_t epilogue;
  bool fp32_bias;
};

struct Timing {
  int algorithms = 0;  // how many the heuristic offered (0: none; the epilogue is not supported)
  float best_ms = -1;
};

cublasLtMatrixLayout_t bf16Layout(int64_t rows, int64_t cols) {
  cublasLtMatrixLayout_t layout = nullptr;
  check(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, rows, cols, rows), "cublasLtMatrixLayoutCreate");
  return layout;
}

Timing timeBest(const Lt& lt, const Product& p) {
  cublasLtMatmulDesc_t desc = nullptr;
  check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a), "TRANSA");
  check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b), "TRANSB");
  if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof p.epilogue),
          "EPILOGUE");
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof p.bias),
          "BIAS_POINTER");
    if (p.fp32_bias) {
      const cudaDataType_t type = CUDA_R_32F;
      check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type),
            "BIAS_DATA_TYPE");
    }
  }
  cublasLtMatrixLayout_t la = p.transpose_a ? bf16Layout(p.depth, p.rows) : bf16Layout(p.rows, p.depth);
  cublasLtMatrixLayout_t lb = p.transpose_b ? bf16Layout(p.cols, p.depth) : bf16Layout(p.depth, p.cols);
  cublasLtMatrixLayout_t ld = bf16Layout(p.rows, p.cols);
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace = kWorkspaceBytes;
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                             sizeof workspace),
        "MAX_WORKSPACE_BYTES");
  std::vector<cublasLtMatmulHeuristicResult_t> found(kCandidates);
  int count = 0;
  Timing timing;
  // An unsupported epilogue or bias type answers with an error status or no algorithm: both mean none.
  if (cublasLtMatmulAlgoGetHeuristic(lt.handle, desc, la, lb, ld, ld, pref, kCandidates, found.data(), &count) ==
      CUBLAS_STATUS_SUCCESS) {
    timing.algorithms = count;
  }
  const float one = 1, zero = 0;
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  auto launch = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(lt.handle, desc, &one, p.a, la, p.b, lb, &zero, p.d, ld, p.d, ld, &algo, lt.workspace,
                          kWorkspaceBytes, nullptr);
  };
  for (int i = 0; i < timing.algorithms; ++i) {
    if (launch(found[i].algo) != CUBLAS_STATUS_SUCCESS) continue;  // the warm-up; skip what fails to launch
    check(cudaEventRecord(start), "cudaEventRecord");
    for (int r = 0; r < kTimedLaunches; ++r) check(launch(found[i].algo), "cublasLtMatmul");
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    ms /= kTimedLaunches;
    if (timing.best_ms < 0 || ms < timing.best_ms) timing.best_ms = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  return timing;
}

// The largest difference between the bias gradient on the device (fp32 or bf16) and dy's column
// sums in float64.
double biasGradientError(const std::vector<__nv_bfloat16>& dy, int64_t m, int64_t n, const void* device_bias,
                         bool fp32) {
  std::vector<float> bias(static_cast<size_t>(n));
  if (fp32) {
    check(cudaMemcpy(bias.data(), device_bias, bias.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  } else {
    bias = hostFloats(device_bias, bias.size());
  }
  double worst = 0;
  for (int64_t j = 0; j < n; ++j) {
    double sum = 0;
    for (int64_t i = 0; i < m; ++i) sum += static_cast<double>(__bfloat162float(dy[static_cast<size_t>(i * n + j)]));
    worst = std::max(worst, std::abs(sum - static_cast<double>(bias[static_cast<size_t>(j)])));
  }
  return worst;
}

void printRow(const char* linear, const char* form, const Timing& plain, const Timing& fused) {
  if (fused.best_ms < 0) {
    std::printf("| %s | %s | %d / %d | %.3f | no algorithm | |\n", linear, form, plain.algorithms, fused.algorithms,
                plain.best_ms);
    return;
  }
  std::printf("| %s | %s | %d / %d | %.3f | %.3f | %.2fx |\n", linear, form, plain.algorithms, fused.algorithms,
              plain.best_ms, fused.best_ms, plain.best_ms / fused.best_ms);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t m = argc > 1 ? std::stoll(argv[1]) : 2048;
  const int64_t e = argc > 2 ? std::stoll(argv[2]) : 12288;
  Lt lt;
  check(cublasLtCreate(&lt.handle), "cublasLtCreate");
  check(cudaMalloc(&lt.workspace, kWorkspaceBytes), "cudaMalloc");
  struct Linear {
    const char* name;
    int64_t n, k;  // dW [n, k]: outputs by inputs
  };
  const Linear linears[] = {{"qkv", 3 * e, e}, {"out-projection", e, e}, {"fc1", 4 * e, e}, {"fc2", e, 4 * e}};
  std::printf("# weight gradients of the layer, tokens=%lld e=%lld, bf16, best of %d algorithms\n",
              static_cast<long long>(m), static_cast<long long>(e), kCandidates);
  std::printf("| weight gradient | form | algorithms plain / fused | plain ms | with the epilogue ms | ratio |\n");
  std::printf("|---|---|---|---|---|---|\n");
  bool checked = false;
  for (const Linear& w : linears) {
    // Row-major dy [m, n] and x [m, k] are column-major [n, m] and [k, m].
    const std::vector<__nv_bfloat16> dy_host = randomBf16(static_cast<size_t>(m * w.n), 1);
    void* dy = deviceCopy(dy_host);
    void* x = deviceCopy(randomBf16(static_cast<size_t>(m * w.k), 2));
    void* dw = nullptr;
    void* db = nullptr;
    check(cudaMalloc(&dw, static_cast<size_t>(w.n * w.k) * sizeof(__nv_bfloat16)), "cudaMalloc");
    check(cudaMalloc(&db, static_cast<size_t>(w.n) * sizeof(float)), "cudaMalloc");
    // dW [n, k] row-major as meshfuse lays it: column-major D [k, n] = x [k, m] * dy^T [m, n]; the bias
    // gradient sums D's columns (BGRADB, over B = dy^T).
    Product plain{w.k, w.n, m, false, true, x, dy, dw, nullptr, CUBLASLT_EPILOGUE_DEFAULT, false};
    const Timing t_plain = timeBest(lt, plain);
    for (const bool fp32 : {false, true}) {
      Product fused = plain;
      fused.bias = db;
      fused.epilogue = CUBLASLT_EPILOGUE_BGRADB;
      fused.fp32_bias = fp32;
      const Timing t_fused = timeBest(lt, fused);
      printRow(w.name, fp32 ? "dW, BGRADB, fp32 bias" : "dW, BGRADB, bf16 bias", t_plain, t_fused);
      if (!checked && t_fused.best_ms >= 0) {  // the epilogue's result, once: its last launch wrote db
        check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        std::printf("# %s: BGRADB's %s bias gradient, max |error| against float64 column sums %.3g\n", w.name,
                    fp32 ? "fp32" : "bf16", biasGradientError(dy_host, m, w.n, db, fp32));
        checked = true;
      }
    }
    // dW transposed: column-major D [n, k] = dy [n, m] * x^T [m, k]; the bias gradient sums D's rows (BGRADA).
    Product transposed{w.n, w.k, m, false, true, dy, x, dw, nullptr, CUBLASLT_EPILOGUE_DEFAULT, false};
    const Timing t_transposed = timeBest(lt, transposed);
    transposed.bias = db;
    transposed.epilogue = CUBLASLT_EPILOGUE_BGRADA;
    transposed.fp32_bias = true;
    printRow(w.name, "dW^T, BGRADA, fp32 bias", t_transposed, timeBest(lt, transposed));
    for (void* p : {dy, x, dw, db}) cudaFree(p);
  }
  cudaFree(lt.workspace);
  cublasLtDestroy(lt.handle);
  return 0;
}

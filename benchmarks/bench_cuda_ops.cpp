// GPU benchmarks of the CUDA segment executor against the raw CUDA libraries, in one run:
//  1. a fused 4-op pointwise chain (out = gelu(x * y + 0.5) - x) through the executor: bandwidth
//     (bytes read + written / time) against a plain device copy (cudaMemcpyAsync D2D), the ceiling;
//  2. bf16 linear 8192^3 through the executor (cuBLASLt plan cache) against cuBLASLt called here
//     directly with the same layout: TFLOP/s;
//  3. the host overhead of one execute of a small cached segment (no synchronization);
//  4. attention's dropout mask (runtime/cuda/dropout_mask.h) at the GPT-3 layer's attention shape,
//     both memory orders: bytes written per second against cudaMemsetAsync of as many bytes.
// Prints a markdown table. Usage: bench_cuda_ops [--quick] [--mask] (--mask: the mask rows alone)
#include <cstdio>
#include <cstring>
#include <string>

#if MESHFUSE_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <vector>

#include "ops/ops.h"
#include "runtime/cuda/dropout_mask.h"
#include "runtime/cuda/streams.h"
#include "runtime/segment.h"

using namespace meshfuse;

namespace {

#define CHECK_CUDA(x)                                                                                 \
  do {                                                                                                \
    cudaError_t e_ = (x);                                                                             \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#x) + ": " + cudaGetErrorString(e_)); \
  } while (0)
#define CHECK_LT(x)                                                                                                \
  do {                                                                                                             \
    cublasStatus_t s_ = (x);                                                                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(#x) + " failed: " + std::to_string(s_)); \
  } while (0)

// Median-free simple timing: `iters` back-to-back runs between two events, after `warmup` runs.
double timeMs(const std::function<void()>& f, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) f();
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  CHECK_CUDA(cudaEventRecord(a, nullptr));
  for (int i = 0; i < iters; ++i) f();
  CHECK_CUDA(cudaEventRecord(b, nullptr));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

struct Row {
  std::string what, meshfuse, baseline, ratio;
};
std::vector<Row> g_rows;
void row(const std::string& what, double ours, double base, const char* unit) {
  char a[64], b[64], r[64];
  std::snprintf(a, sizeof a, "%.1f %s", ours, unit);
  std::snprintf(b, sizeof b, "%.1f %s", base, unit);
  std::snprintf(r, sizeof r, "%.2f", ours / base);
  g_rows.push_back({what, a, b, r});
  std::printf("  %s: meshfuse %s, baseline %s\n", what.c_str(), a, b);
  std::fflush(stdout);
}

ShapeMap shapesOf(const Fusion& f) {
  ShapeMap s;
  for (const auto& v : f.vals())
    if (v->isTensor()) s[v.get()] = static_cast<TensorView*>(v.get())->shape();
  return s;
}

Segment segmentOf(const Fusion& f, Segment::Kind kind, std::vector<Val*> inputs, std::vector<TensorView*> outputs) {
  Segment seg;
  seg.kind = kind;
  for (const auto& e : f.exprs()) seg.exprs.push_back(e.get());
  seg.inputs = std::move(inputs);
  seg.outputs = std::move(outputs);
  return seg;
}

// Uniform random values in [-1, 1) (xorshift64 on the host, cast on the device): constant data can
// run faster than real data (seen on an H200: a bf16 matmul 13% faster on zeros).
Tensor deviceRandom(const std::vector<int64_t>& shape, DataType dtype, uint64_t seed) {
  Tensor host = Tensor::empty(shape, DataType::Float);
  float* p = host.dataAs<float>();
  uint64_t state = 0x9E3779B97F4A7C15ull ^ (seed * 0xD1B54A32D192ED03ull);
  for (int64_t i = 0; i < host.numel(); ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    p[i] = static_cast<float>(static_cast<double>(state >> 11) * 0x1.0p-52 - 1.0);
  }
  Tensor device = host.to(Device::cuda(0));
  return dtype == DataType::Float ? device : device.to(dtype);
}

void pointwiseChain(DataType dtype, int64_t n, int iters) {
  Fusion f;
  TensorView* x = f.newTensor(dtype, {n});
  TensorView* y = f.newTensor(dtype, {n});
  f.addInput(x);
  f.addInput(y);
  TensorView* t = ops::binary(OpType::Add, ops::binary(OpType::Mul, x, y), f.newScalar(DataType::Double, 0.5));
  TensorView* out = ops::binary(OpType::Sub, ops::unary(OpType::Gelu, t), x);
  Segment seg = segmentOf(f, Segment::Kind::Pointwise, {x, y}, {out});
  ShapeMap shapes = shapesOf(f);
  auto exec = makeCudaExecutor(0);
  ValueMap values;
  values.tensors[x] = deviceRandom({n}, dtype, 1);
  values.tensors[y] = deviceRandom({n}, dtype, 2);
  const double bytes_chain = 3.0 * static_cast<double>(n) * static_cast<double>(dataTypeSize(dtype));
  double ms = timeMs([&] { exec->run(seg, values, shapes); }, 3, iters);
  Tensor src = values.tensors[x], dst = Tensor::empty({n}, dtype, Device::cuda(0));
  double copy_ms = timeMs(
      [&] { CHECK_CUDA(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, nullptr)); }, 3,
      iters);
  const double bytes_copy = 2.0 * static_cast<double>(src.nbytes());
  row("pointwise chain gelu(x*y+0.5)-x, " + toString(dtype) + " " + std::to_string(n >> 20) +
          "M elements (GB/s, "
          "read+write; baseline: cudaMemcpyAsync D2D)",
      bytes_chain / ms / 1e6, bytes_copy / copy_ms / 1e6, "GB/s");
}

// cuBLASLt directly: row-major out[m,n] = x[m,k] @ w[n,k]^T in bf16, fp32 accumulation.
// cppcheck-suppress constParameter ; out is written (through its data pointer)
double directLinearMs(const Tensor& x, const Tensor& w, Tensor& out, int64_t m, int64_t n, int64_t k, int iters) {
  cublasLtHandle_t h;
  CHECK_LT(cublasLtCreate(&h));
  cublasLtMatmulDesc_t desc;
  CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtMatrixLayout_t la, lb, lc;
  CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k));  // w as column-major k x n
  CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k));  // x as column-major k x m
  CHECK_LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, m, n));
  size_t ws_bytes = 32u << 20;
  void* ws;
  CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
  cublasLtMatmulPreference_t pref;
  CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
  CHECK_LT(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  CHECK_LT(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &res, &found));
  if (found == 0) throw std::runtime_error("no cuBLASLt algorithm");
  const float one = 1, zero = 0;
  double ms = timeMs(
      [&] {
        CHECK_LT(cublasLtMatmul(h, desc, &one, w.data(), la, x.data(), lb, &zero, out.data(), lc, out.data(), lc,
                                &res.algo, ws, ws_bytes, nullptr));
      },
      3, iters);
  cudaFree(ws);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
  return ms;
}

void linearBf16(int64_t s, int iters, bool bias) {
  Fusion f;
  TensorView* x = f.newTensor(DataType::BFloat16, {s, s});
  TensorView* w = f.newTensor(DataType::BFloat16, {s, s});
  TensorView* b = bias ? f.newTensor(DataType::BFloat16, {s}) : nullptr;
  f.addInput(x);
  f.addInput(w);
  std::vector<Val*> inputs{x, w};
  if (b) {
    f.addInput(b);
    inputs.push_back(b);
  }
  TensorView* y = ops::linear(x, w, b);
  Segment seg = segmentOf(f, Segment::Kind::Matmul, inputs, {y});
  ShapeMap shapes = shapesOf(f);
  auto exec = makeCudaExecutor(0);
  ValueMap values;
  values.tensors[x] = deviceRandom({s, s}, DataType::BFloat16, 3);
  values.tensors[w] = deviceRandom({s, s}, DataType::BFloat16, 4);
  if (b) values.tensors[b] = deviceRandom({s}, DataType::BFloat16, 5);
  const double flops = 2.0 * static_cast<double>(s) * static_cast<double>(s) * static_cast<double>(s);
  double ms = timeMs([&] { exec->run(seg, values, shapes); }, 3, iters);
  Tensor out = Tensor::empty({s, s}, DataType::BFloat16, Device::cuda(0));
  double direct = directLinearMs(values.tensors[x], values.tensors[w], out, s, s, s, iters);
  row("bf16 linear " + std::to_string(s) + "^3" + (bias ? " + bias (fused epilogue)" : "") +
          " (TFLOP/s; baseline: cublasLtMatmul direct, no bias)",
      flops / ms / 1e9, flops / direct / 1e9, "TFLOP/s");
}

void hostOverhead(int iters) {
  Fusion f;
  TensorView* x = f.newTensor(DataType::Float, {1024});
  f.addInput(x);
  TensorView* out = ops::unary(OpType::Relu, ops::binary(OpType::Mul, x, f.newScalar(DataType::Double, 2.0)));
  Segment seg = segmentOf(f, Segment::Kind::Pointwise, {x}, {out});
  ShapeMap shapes = shapesOf(f);
  auto exec = makeCudaExecutor(0);
  ValueMap values;
  values.tensors[x] = deviceRandom({1024}, DataType::Float, 6);
  for (int i = 0; i < 100; ++i) exec->run(seg, values, shapes);
  CHECK_CUDA(cudaDeviceSynchronize());
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) exec->run(seg, values, shapes);
  auto t1 = std::chrono::steady_clock::now();
  CHECK_CUDA(cudaDeviceSynchronize());
  const double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / iters;
  // The baseline: the bare launch cost of an empty-work device op of the same kind (a memset of 4 KiB).
  Tensor y = Tensor::empty({1024}, DataType::Float, Device::cuda(0));
  auto t2 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) CHECK_CUDA(cudaMemsetAsync(y.data(), 0, y.nbytes(), nullptr));
  auto t3 = std::chrono::steady_clock::now();
  CHECK_CUDA(cudaDeviceSynchronize());
  const double base = std::chrono::duration<double, std::micro>(t3 - t2).count() / iters;
  row("host time per execute, cached 2-op segment of 1024 floats (us; baseline: cudaMemsetAsync of 4 KiB)", us, base,
      "us");
}

// The mask of b=1, h=96, s=2048 causal attention at p = 0.1 in bf16 (805 MB), as the GPT-3 layer's
// forward draws it, against a memset of the same bytes (the write bandwidth the kernel could reach).
void dropoutMasks(int iters) {
  AttentionParams p;
  p.batch = 1;
  p.heads = p.global_heads = 96;
  p.seq_q = p.seq_kv = 2048;
  p.causal = true;
  p.dropout_p = 0.1;
  p.seed = 1234;
  p.offset = 0;
  for (cuda::MaskOrder order : {cuda::MaskOrder::QueryMajor, cuda::MaskOrder::KeyMajor}) {
    const bool key_major = order == cuda::MaskOrder::KeyMajor;
    const double bytes = static_cast<double>(p.heads * p.seq_q * p.seq_kv) * 2;
    Tensor kept = cuda::dropoutMask(0, p, DataType::BFloat16, nullptr, nullptr, order);  // compiles the kernel
    const double ms =
        timeMs([&] { kept = cuda::dropoutMask(0, p, DataType::BFloat16, nullptr, nullptr, order); }, 2, iters);
    const double memset_ms =
        timeMs([&] { CHECK_CUDA(cudaMemsetAsync(kept.data(), 0, kept.nbytes(), nullptr)); }, 2, iters);
    std::printf("  dropout mask %s: %.1f us, memset %.1f us\n", key_major ? "key-major" : "query-major", ms * 1e3,
                memset_ms * 1e3);
    row(std::string("dropout mask b=1 h=96 s=2048 causal p=0.1 bf16, ") + (key_major ? "key-major" : "query-major") +
            " (GB/s written; baseline: cudaMemsetAsync of the same bytes)",
        bytes / ms / 1e6, bytes / memset_ms / 1e6, "GB/s");
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, mask_only = false;
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::strcmp(argv[i], "--quick") == 0;
    mask_only = mask_only || std::strcmp(argv[i], "--mask") == 0;
  }
  std::string why;
  if (cuda::deviceCount(&why) == 0) {
    std::printf("bench_cuda_ops: no CUDA device (%s); nothing to measure\n", why.c_str());
    return 0;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const int64_t n = quick ? (int64_t{1} << 24) : (int64_t{1} << 28);
  if (!mask_only) {
    pointwiseChain(DataType::Float, n, quick ? 5 : 20);
    pointwiseChain(DataType::BFloat16, n, quick ? 5 : 20);
    linearBf16(quick ? 2048 : 8192, quick ? 5 : 20, false);
    linearBf16(quick ? 2048 : 8192, quick ? 5 : 20, true);
    hostOverhead(quick ? 2000 : 20000);
  }
  dropoutMasks(quick ? 5 : 20);
  std::printf("\n| benchmark | meshfuse | baseline | ratio |\n|---|---|---|---|\n");
  for (const Row& r : g_rows)
    std::printf("| %s | %s | %s | %s |\n", r.what.c_str(), r.meshfuse.c_str(), r.baseline.c_str(), r.ratio.c_str());
  return 0;
}

#else
int main() {
  std::printf("bench_cuda_ops: meshfuse was built without CUDA\n");
  return 0;
}
#endif

// What the cuBLASLt probes share: a status check that ends the probe, their workspace size, random
// bf16 operands drawn on the host, and copies to and from the device. Host code only, so the C++
// compiler builds the probes. (Global names: each probe is one file and one program.)
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

// Ends the probe, naming the call, on a non-zero status (cudaError_t or cublasStatus_t).
inline void check(int status, const char* what) {
  if (status == 0) return;
  std::fprintf(stderr, "%s failed: status %d\n", what, status);
  std::exit(1);
}

inline constexpr size_t kWorkspaceBytes = size_t{64} << 20;

// Random bf16 values in [-0.5, 0.5), a hash of the index (so no device code draws them).
inline std::vector<__nv_bfloat16> randomBf16(size_t count, uint32_t seed) {
  std::vector<__nv_bfloat16> values(count);
  for (size_t i = 0; i < count; ++i) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    values[i] = __float2bfloat16(static_cast<float>(x & 0xffffu) / 65536.0f - 0.5f);
  }
  return values;
}

inline void* deviceCopy(const std::vector<__nv_bfloat16>& host) {
  void* device = nullptr;
  check(cudaMalloc(&device, host.size() * sizeof(__nv_bfloat16)), "cudaMalloc");
  check(cudaMemcpy(device, host.data(), host.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice), "cudaMemcpy");
  return device;
}

// `count` bf16 values on the device, widened to float on the host.
inline std::vector<float> hostFloats(const void* device, size_t count) {
  std::vector<__nv_bfloat16> narrow(count);
  check(cudaMemcpy(narrow.data(), device, count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost), "cudaMemcpy");
  std::vector<float> wide(count);
  std::transform(narrow.begin(), narrow.end(), wide.begin(), [](__nv_bfloat16 v) { return __bfloat162float(v); });
  return wide;
}

// How cuDNN's SDPA forward and backward run with a custom dropout mask of each dtype, against its
// in-kernel dropout and no dropout, at the GPT-3 layer's attention ([1, 96, 2048, 2048], d = 128,
// bf16, causal, p = 0.1): whether the graph is supported, its median time, and how far its outputs
// are from the reference variant (a bf16 mask that holds the rounded keep scale, corrected through
// dropout_scale: what meshfuse runs today, checked against float64 by its tests).
//
// A 0/1 mask (uint8, int8, bool) leaves the whole keep scale to dropout_scale, which cuDNN's
// backward also applies to D = rowsum(dO * O) (BENCHMARKS.md, session 7); the "O/scale" rows pass
// O divided by that scale to the backward to cancel it, with dropout_scale_inv 1 (the others pass
// 1 / scale there, the frontend's own way to cancel it).
//
// Built and run on the GPU machine by `scripts/test-gpu --mask-probe` (the frontend's headers from
// .gpu-deps; cuDNN from torch's environment, as meshfuse's build takes it):
//   nvcc -std=c++17 -O2 -arch=sm_90 -diag-suppress 128,2810 scripts/cudnn-mask-probe.cu -I<frontend include>
//       -l:libcudnn.so.9 -lnvrtc -lcuda -o mask-probe && ./mask-probe
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace fe = cudnn_frontend;

namespace {

constexpr int64_t B = 1, H = 96, S = 2048, D = 128;
constexpr float kP = 0.1f;

std::vector<int64_t> rowMajor(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (size_t i = dims.size() - 1; i-- > 0;) strides[i] = strides[i + 1] * dims[i + 1];
  return strides;
}

__device__ unsigned hashIndex(unsigned long long i, unsigned salt) {
  unsigned x = static_cast<unsigned>(i) * 0x9E3779B1u ^ static_cast<unsigned>(i >> 32) * 0x85EBCA77u ^ salt;
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

__global__ void fillUniform(__nv_bfloat16* t, long long n, unsigned salt) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x)
    t[i] = __float2bfloat16((hashIndex(i, salt) >> 8) * (2.0f / 16777216.0f) - 1.0f);
}

// Mask element i: `kept` bits (of `bytes` bytes) where its hash keeps it, else 0.
__global__ void fillMask(void* m, long long n, int bytes, unsigned kept) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x) {
    const bool keep = (hashIndex(i, 77u) >> 8) * (1.0f / 16777216.0f) >= kP;
    const unsigned v = keep ? kept : 0u;
    if (bytes == 1) static_cast<unsigned char*>(m)[i] = static_cast<unsigned char>(v);
    if (bytes == 2) static_cast<unsigned short*>(m)[i] = static_cast<unsigned short>(v);
    if (bytes == 4) static_cast<unsigned*>(m)[i] = v;
  }
}

__global__ void scaleBf16(const __nv_bfloat16* in, __nv_bfloat16* out, long long n, float s) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x)
    out[i] = __float2bfloat16(__bfloat162float(in[i]) * s);
}

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kMask, kScale, kScaleInv, kSeed, kOffset };

struct Variant {
  std::string name;
  int mode;  // 0 none, 1 in-kernel dropout, 2 custom mask
  fe::DataType_t mask_dtype = fe::DataType_t::BFLOAT16;
  int mask_bytes = 2;
  unsigned kept_bits = 0;
  float scale = 1.0f;  // dropout_scale
  bool o_over_scale = false;
};

std::shared_ptr<fe::graph::Graph> build(cudnnHandle_t handle, bool forward, const Variant& v, std::string& why) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char* name, const std::vector<int64_t>& dims, int64_t uid, fe::DataType_t dt) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_dim(dims)
                         .set_stride(rowMajor(dims))
                         .set_uid(uid)
                         .set_data_type(dt));
  };
  auto scalar = [&](const char* name, int64_t uid, fe::DataType_t dt, bool by_value) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_dim({1, 1, 1, 1})
                         .set_stride({1, 1, 1, 1})
                         .set_uid(uid)
                         .set_is_pass_by_value(by_value)
                         .set_data_type(dt));
  };
  const std::vector<int64_t> qd{B, H, S, D}, sd{B, H, S, 1}, md{B, H, S, S};
  auto q = tensor("q", qd, kQ, fe::DataType_t::BFLOAT16), k = tensor("k", qd, kK, fe::DataType_t::BFLOAT16),
       vv = tensor("v", qd, kV, fe::DataType_t::BFLOAT16);
  if (forward) {
    auto a = fe::graph::SDPA_attributes().set_name("f").set_generate_stats(true).set_causal_mask(true).set_attn_scale(
        0.0883883f);
    if (v.mode == 1)
      a.set_dropout(kP, scalar("seed", kSeed, fe::DataType_t::INT64, false),
                    scalar("offset", kOffset, fe::DataType_t::INT64, false));
    if (v.mode == 2)
      a.set_dropout(tensor("mask", md, kMask, v.mask_dtype), scalar("scale", kScale, fe::DataType_t::FLOAT, true));
    auto [o, stats] = g->sdpa(q, k, vv, a);
    o->set_output(true).set_dim(qd).set_stride(rowMajor(qd)).set_uid(kO).set_data_type(fe::DataType_t::BFLOAT16);
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
  } else {
    auto o = tensor("o", qd, kO, fe::DataType_t::BFLOAT16), dO = tensor("dO", qd, kDO, fe::DataType_t::BFLOAT16);
    auto stats = tensor("stats", sd, kStats, fe::DataType_t::FLOAT);
    auto a = fe::graph::SDPA_backward_attributes().set_name("b").set_causal_mask(true).set_attn_scale(0.0883883f);
    if (v.mode == 1)
      a.set_dropout(kP, scalar("seed", kSeed, fe::DataType_t::INT64, false),
                    scalar("offset", kOffset, fe::DataType_t::INT64, false));
    if (v.mode == 2)
      a.set_dropout(tensor("mask", md, kMask, v.mask_dtype), scalar("scale", kScale, fe::DataType_t::FLOAT, true),
                    scalar("scale_inv", kScaleInv, fe::DataType_t::FLOAT, true));
    auto [dq, dk, dv] = g->sdpa_backward(q, k, vv, o, dO, stats, a);
    for (auto [t, uid] : {std::pair{dq, kDQ}, {dk, kDK}, {dv, kDV}})
      t->set_output(true).set_dim(qd).set_stride(rowMajor(qd)).set_uid(uid).set_data_type(fe::DataType_t::BFLOAT16);
  }
  for (auto [e, what] : {std::pair{g->validate(), "validate"},
                         {g->build_operation_graph(handle), "build_operation_graph"},
                         {g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans"},
                         {g->check_support(handle), "check_support"},
                         {g->build_plans(handle), "build_plans"}}) {
    (void)0;
    if (!e.is_good()) {
      why = std::string(what) + ": " + e.get_message();
      return nullptr;
    }
  }
  return g;
}

}  // namespace

int main() {
  cudnnHandle_t handle;
  cudnnCreate(&handle);
  std::printf("cuDNN %zu, [%lld, %lld, %lld, %lld] bf16 causal, p = %.2f\n", cudnnGetVersion(), (long long)B,
              (long long)H, (long long)S, (long long)D, kP);
  const long long nq = B * H * S * D, nm = B * H * S * S;
  const float keep_scale = 1.0f / (1.0f - kP);
  const float held = __bfloat162float(__float2bfloat16(keep_scale));
  void *q, *k, *v, *o, *o_scaled, *stats, *dO, *dq, *dk, *dv, *mask, *seed, *offset;
  for (void** p : {&q, &k, &v, &o, &o_scaled, &dO, &dq, &dk, &dv}) cudaMalloc(p, nq * 2);
  cudaMalloc(&stats, B * H * S * 4);
  cudaMalloc(&mask, nm * 4);
  cudaMalloc(&seed, 8);
  cudaMalloc(&offset, 8);
  const long long seed_v = 1234, offset_v = 0;
  cudaMemcpy(seed, &seed_v, 8, cudaMemcpyHostToDevice);
  cudaMemcpy(offset, &offset_v, 8, cudaMemcpyHostToDevice);
  fillUniform<<<1024, 256>>>(static_cast<__nv_bfloat16*>(q), nq, 1);
  fillUniform<<<1024, 256>>>(static_cast<__nv_bfloat16*>(k), nq, 2);
  fillUniform<<<1024, 256>>>(static_cast<__nv_bfloat16*>(v), nq, 3);
  fillUniform<<<1024, 256>>>(static_cast<__nv_bfloat16*>(dO), nq, 4);
  const unsigned one_bf16 = 0x3F80u, held_bits = __bfloat16_as_ushort(__float2bfloat16(keep_scale));
  unsigned one_f32, s_f32;
  std::memcpy(&one_f32, &keep_scale, 4);
  (void)one_f32;
  s_f32 = one_f32;
  std::vector<Variant> variants{
      {"bf16 mask = rounded scale (reference)", 2, fe::DataType_t::BFLOAT16, 2, held_bits, keep_scale / held},
      {"no dropout", 0},
      {"in-kernel dropout", 1},
      {"fp32 mask = scale", 2, fe::DataType_t::FLOAT, 4, s_f32, 1.0f},
      {"bf16 mask = 1, scale", 2, fe::DataType_t::BFLOAT16, 2, one_bf16, keep_scale},
      {"bf16 mask = 1, scale, O/scale", 2, fe::DataType_t::BFLOAT16, 2, one_bf16, keep_scale, true},
      {"uint8 mask = 1, scale", 2, fe::DataType_t::UINT8, 1, 1u, keep_scale},
      {"uint8 mask = 1, scale, O/scale", 2, fe::DataType_t::UINT8, 1, 1u, keep_scale, true},
      {"int8 mask = 1, scale, O/scale", 2, fe::DataType_t::INT8, 1, 1u, keep_scale, true},
      {"bool mask, scale, O/scale", 2, fe::DataType_t::BOOLEAN, 1, 1u, keep_scale, true},
  };
  std::vector<std::vector<float>> reference;  // o, dq, dk, dv of the first variant
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (const Variant& var : variants) {
    std::printf("\n%s\n", var.name.c_str());
    if (var.mode == 2) fillMask<<<4096, 256>>>(mask, nm, var.mask_bytes, var.kept_bits);
    std::vector<std::vector<float>> outs;
    for (bool forward : {true, false}) {
      std::string why;
      auto g = build(handle, forward, var, why);
      if (!g) {
        std::printf("  %s: unsupported (%s)\n", forward ? "fwd" : "bwd", why.c_str());
        continue;
      }
      int64_t ws = 0;
      (void)g->get_workspace_size(ws);
      void* w = nullptr;
      if (ws > 0) cudaMalloc(&w, ws);
      float scale = var.scale, scale_inv = var.o_over_scale ? 1.0f : 1.0f / var.scale;
      std::unordered_map<int64_t, void*> pack{{kQ, q}, {kK, k}, {kV, v}, {kStats, stats}};
      if (forward) {
        pack[kO] = o;
      } else {
        void* o_in = o;
        if (var.o_over_scale) {
          scaleBf16<<<1024, 256>>>(static_cast<const __nv_bfloat16*>(o), static_cast<__nv_bfloat16*>(o_scaled), nq,
                                   1.0f / var.scale);
          o_in = o_scaled;
        }
        pack[kO] = o_in;
        pack[kDO] = dO;
        pack[kDQ] = dq;
        pack[kDK] = dk;
        pack[kDV] = dv;
      }
      if (var.mode == 1) {
        pack[kSeed] = seed;
        pack[kOffset] = offset;
      }
      if (var.mode == 2) {
        pack[kMask] = mask;
        pack[kScale] = &scale;
        if (!forward) pack[kScaleInv] = &scale_inv;
      }
      std::vector<float> ms;
      for (int it = 0; it < 13; ++it) {
        cudaEventRecord(start);
        auto e = g->execute(handle, pack, w);
        cudaEventRecord(stop);
        cudaEventSynchronize(stop);
        if (!e.is_good()) {
          std::printf("  execute: %s\n", e.get_message().c_str());
          break;
        }
        float t = 0;
        cudaEventElapsedTime(&t, start, stop);
        if (it >= 3) ms.push_back(t);
      }
      if (w) cudaFree(w);
      if (ms.empty()) continue;
      std::sort(ms.begin(), ms.end());
      const double flops = 4.0 * B * H * S * S * D / 2 * (forward ? 1.0 : 2.5);
      std::printf("  %s: %.3f ms (%.0f TFLOP/s)\n", forward ? "fwd" : "bwd", ms[ms.size() / 2],
                  flops / ms[ms.size() / 2] / 1e9);
      auto fetch = [&](void* t) {
        std::vector<__nv_bfloat16> h(nq);
        cudaMemcpy(h.data(), t, nq * 2, cudaMemcpyDeviceToHost);
        std::vector<float> f(nq);
        for (long long i = 0; i < nq; ++i) f[i] = __bfloat162float(h[i]);
        return f;
      };
      if (forward)
        outs.push_back(fetch(o));
      else
        for (void* t : {dq, dk, dv}) outs.push_back(fetch(t));
    }
    if (reference.empty()) {
      reference = outs;
      continue;
    }
    if (var.mode != 2 || outs.size() != reference.size()) continue;
    const char* names[] = {"o", "dq", "dk", "dv"};
    for (size_t t = 0; t < outs.size(); ++t) {
      double diff = 0, top = 0;
      for (long long i = 0; i < nq; ++i) {
        diff = std::max(diff, static_cast<double>(std::fabs(outs[t][i] - reference[t][i])));
        top = std::max(top, static_cast<double>(std::fabs(reference[t][i])));
      }
      std::printf("  %s: max |diff| %.3g of max |ref| %.3g (%.2f%%)\n", names[t], diff, top, 100 * diff / top);
    }
  }
  return 0;
}

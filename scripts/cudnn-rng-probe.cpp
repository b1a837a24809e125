// What cuDNN's in-kernel attention dropout drops, for recovering its Philox layout (issue 13:
// meshfuse's CPU must draw the same mask as CUDA, so meshfuse hands cuDNN a mask of its own today,
// at the cost BENCHMARKS.md's transformer section measures).
//
// For a few (seed, offset) pairs it runs cuDNN's SDPA forward (bf16, [1, 2, 64, 128], d = 128) with
// in-kernel dropout at keep-threshold steps p = k / STEPS (k = 1 .. STEPS - 1) and asks for the
// RNG dump (SDPA_attributes::set_rng_dump), which is the keep mask. A smaller p keeps a superset, so
// the number of steps at which an element is kept bins its uniform into STEPS bins:
// bins_s<seed>_o<offset>.u8 ([b, h, s_q, s_kv], one byte each) in the output directory.
// Each step builds a cuDNN graph (about 0.6 s on the H200): STEPS = 64 and two pairs take ~80 s.
//
// Build and run on the GPU machine (its cuDNN; the frontend's headers from .gpu-deps):
//   g++ -std=c++17 -O1 scripts/cudnn-rng-probe.cpp -I<frontend include> -I$CUDA_HOME/include
//       -L$CUDA_HOME/lib64 -lcudnn -lcudart -lnvrtc -lcuda -o rng-probe && ./rng-probe $OUT 64
#include <cuda_runtime.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <vector>

namespace fe = cudnn_frontend;

namespace {

std::vector<int64_t> rowMajor(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (size_t i = dims.size() - 1; i-- > 0;) strides[i] = strides[i + 1] * dims[i + 1];
  return strides;
}

bool good(fe::error_t e, const char* what) {
  if (e.is_good()) return true;
  std::fprintf(stderr, "%s: %s\n", what, e.get_message().c_str());
  return false;
}

struct Shape {
  int64_t b = 1, h = 2, sq = 64, skv = 128, d = 128;
  int64_t elements() const { return b * h * sq * skv; }
};

// The keep mask (1 kept, 0 dropped) of cuDNN's dropout at probability p, or empty on failure.
std::vector<float> keepMask(cudnnHandle_t handle, const Shape& s, int64_t seed, int64_t offset, float p) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char* name, const std::vector<int64_t>& dims, int64_t uid, fe::DataType_t dtype) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_dim(dims)
                         .set_stride(rowMajor(dims))
                         .set_uid(uid)
                         .set_data_type(dtype));
  };
  const std::vector<int64_t> qd{s.b, s.h, s.sq, s.d}, kd{s.b, s.h, s.skv, s.d}, md{s.b, s.h, s.sq, s.skv};
  auto q = tensor("q", qd, 1, fe::DataType_t::BFLOAT16), k = tensor("k", kd, 2, fe::DataType_t::BFLOAT16),
       v = tensor("v", kd, 3, fe::DataType_t::BFLOAT16);
  auto seed_t = tensor("seed", {1, 1, 1, 1}, 10, fe::DataType_t::INT64);
  auto offset_t = tensor("offset", {1, 1, 1, 1}, 11, fe::DataType_t::INT64);
  auto dump = tensor("rng_dump", md, 20, fe::DataType_t::FLOAT);
  auto attrs =
      fe::graph::SDPA_attributes().set_name("probe").set_generate_stats(true).set_attn_scale(0.125f).set_dropout(
          p, seed_t, offset_t);
  attrs.set_rng_dump(dump);
  auto [o, stats] = g->sdpa(q, k, v, attrs);
  o->set_output(true).set_dim(qd).set_stride(rowMajor(qd)).set_uid(4).set_data_type(fe::DataType_t::BFLOAT16);
  stats->set_output(true).set_uid(5).set_data_type(fe::DataType_t::FLOAT);
  dump->set_output(true);
  if (!good(g->validate(), "validate") || !good(g->build_operation_graph(handle), "build_operation_graph") ||
      !good(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans") ||
      !good(g->check_support(handle), "check_support") || !good(g->build_plans(handle), "build_plans"))
    return {};
  int64_t workspace_bytes = 0;
  if (!good(g->get_workspace_size(workspace_bytes), "get_workspace_size")) return {};
  const int64_t qkv = s.b * s.h * s.skv * s.d * 2;
  void *Q, *K, *V, *O, *S, *D, *SEED, *OFF, *W = nullptr;
  cudaMalloc(&Q, qkv);
  cudaMalloc(&K, qkv);
  cudaMalloc(&V, qkv);
  cudaMalloc(&O, qkv);
  cudaMalloc(&S, s.b * s.h * s.sq * 4);
  cudaMalloc(&D, s.elements() * 4);
  cudaMalloc(&SEED, 8);
  cudaMalloc(&OFF, 8);
  if (workspace_bytes > 0) cudaMalloc(&W, workspace_bytes);
  for (void* t : {Q, K, V}) cudaMemset(t, 0, qkv);
  cudaMemcpy(SEED, &seed, 8, cudaMemcpyHostToDevice);
  cudaMemcpy(OFF, &offset, 8, cudaMemcpyHostToDevice);
  std::unordered_map<int64_t, void*> pack{{1, Q}, {2, K}, {3, V}, {4, O}, {5, S}, {10, SEED}, {11, OFF}, {20, D}};
  std::vector<float> mask(s.elements());
  if (good(g->execute(handle, pack, W), "execute"))
    cudaMemcpy(mask.data(), D, mask.size() * 4, cudaMemcpyDeviceToHost);
  else
    mask.clear();
  for (void* t : {Q, K, V, O, S, D, SEED, OFF, W})
    if (t) cudaFree(t);
  return mask;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 64;
  cudnnHandle_t handle;
  cudnnCreate(&handle);
  std::printf("cuDNN %zu, %d steps\n", cudnnGetVersion(), steps);
  const Shape shape;
  for (auto [seed, offset] : std::vector<std::pair<int64_t, int64_t>>{{1234, 0}, {1234, 1}}) {
    std::vector<unsigned char> bins(shape.elements(), 0);
    std::vector<float> previous;
    int64_t not_nested = 0;  // kept at a larger p but dropped at a smaller one
    for (int k = 1; k < steps; ++k) {
      const std::vector<float> keep = keepMask(handle, shape, seed, offset, static_cast<float>(k) / steps);
      if (keep.empty()) return 1;
      for (size_t e = 0; e < keep.size(); ++e) {
        bins[e] += keep[e] > 0.5f ? 1 : 0;
        if (!previous.empty() && keep[e] > previous[e]) ++not_nested;
      }
      previous = keep;
    }
    const std::string name = dir + "/bins_s" + std::to_string(seed) + "_o" + std::to_string(offset) + ".u8";
    FILE* f = std::fopen(name.c_str(), "wb");
    std::fwrite(bins.data(), 1, bins.size(), f);
    std::fclose(f);
    std::printf("%s: %lld elements kept at a larger p and dropped at a smaller one\n", name.c_str(),
                static_cast<long long>(not_nested));
  }
  return 0;
}

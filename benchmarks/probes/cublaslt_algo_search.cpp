// Probe: does cuBLASLt hold a faster kernel for the transformer layer's GEMMs than the best of the
// eight its heuristic offers, which is what meshfuse's autotuner times (`MESHFUSE_MATMUL_AUTOTUNE`)?
// The layer's GEMMs are about 90% of each pass on one GPU, so they decide the issue-14 aims there;
// session 23 found the heuristic never offers more than eight (BENCHMARKS.md), and session 29's first
// run found the heuristic asked one algorithm id at a time (CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID) adds
// none, and configurations of the same algorithm id (tile, cluster shape, custom option) up to 1.11x
// faster than the best of the eight; the second, retiming each candidate set's best alternately, found
// those gains to be the GPU's run-to-run spread (0.84-1.07x): the autotuner keeps to the eight.
//
// For each of the GPT-3 layer's twelve products (forward x W^T, input gradient dy W, weight gradient
// dy^T x, for qkv, the out-projection, fc1 and fc2; bf16 operands and output, fp32 compute, in the
// transposes meshfuse hands cuBLASLt) it times, on the same operands, candidate sets that grow:
//   1. the heuristic's eight (the autotuner's candidates today);
//   2. with the heuristic's configurations for the same shape under the other transposes;
//   3. with every product's heuristic configurations (the pool a process gathers as it tunes);
//   4. with an even sample of every configuration cublasLtMatmulAlgoCheck accepts for the
//      heuristic's first algorithm id (each tile, stage count, cluster shape, swizzle and custom
//      option, split-K off), up to a budget a product;
// then retimes each set's best in alternating rounds (the GPU's clock moves by more than the
// differences sought) and checks the enumerated best's result against the heuristic's. Built with
// CUDA (target probe_cublaslt_algo_search):
//   build/benchmarks/probe_cublaslt_algo_search [tokens [hidden [budget]]]   (default 2048 12288 400)
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cublaslt_probe.h"

namespace {

constexpr int kHeuristicCandidates = 8;

// The configuration fields that name a kernel (cublasLtMatmulAlgoConfigAttributes_t), for printing
// and for telling candidates apart.
struct Config {
  int32_t id = 0;
  uint32_t tile = 0, stages = 0, swizzle = 0, custom = 0;
  int32_t split_k = 1;
  uint16_t inner = 0, cluster = 0;
  auto key() const { return std::array<int64_t, 8>{id, tile, stages, swizzle, custom, split_k, inner, cluster}; }
};

template <typename T>
T configValue(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  size_t written = 0;
  check(cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof value, &written), "AlgoConfigGetAttribute");
  return value;
}

Config configOf(const cublasLtMatmulAlgo_t& algo) {
  Config c;
  c.id = configValue<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID);
  c.tile = configValue<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID);
  c.stages = configValue<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID);
  c.swizzle = configValue<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING);
  c.custom = configValue<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION);
  c.split_k = configValue<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  c.inner = configValue<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID);
  c.cluster = configValue<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
  return c;
}

std::string describe(const Config& c) {
  char text[160];
  std::snprintf(text, sizeof text, "id %d tile %u stages %u cluster %u swizzle %u custom %u inner %u split %d", c.id,
                c.tile, c.stages, c.cluster, c.swizzle, c.custom, c.inner, c.split_k);
  return text;
}

// An array capability (tile ids, stage ids) of an initialized algorithm.
std::vector<uint32_t> capabilityList(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0)
    return {0};
  std::vector<uint32_t> values(bytes / sizeof(uint32_t));
  check(cublasLtMatmulAlgoCapGetAttribute(&algo, attr, values.data(), bytes, &bytes), "AlgoCapGetAttribute");
  return values;
}

int32_t capabilityValue(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  int32_t value = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, &value, sizeof value, &written) != CUBLAS_STATUS_SUCCESS) return 0;
  return value;
}

// One product D = op(A) op(B) in cuBLASLt's column-major terms, with its descriptors.
struct Product {
  const char* name;
  int64_t rows, cols, depth;
  bool transpose_a, transpose_b;
  const void* a;
  const void* b;
  void* d;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
};

cublasLtMatrixLayout_t bf16Layout(int64_t rows, int64_t cols) {
  cublasLtMatrixLayout_t layout = nullptr;
  check(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, rows, cols, rows), "cublasLtMatrixLayoutCreate");
  return layout;
}

void describeProduct(Product& p) {
  check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a), "TRANSA");
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b), "TRANSB");
  p.la = p.transpose_a ? bf16Layout(p.depth, p.rows) : bf16Layout(p.rows, p.depth);
  p.lb = p.transpose_b ? bf16Layout(p.cols, p.depth) : bf16Layout(p.depth, p.cols);
  p.ld = bf16Layout(p.rows, p.cols);
}

void releaseProduct(Product& p) {
  cublasLtMatrixLayoutDestroy(p.la);
  cublasLtMatrixLayoutDestroy(p.lb);
  cublasLtMatrixLayoutDestroy(p.ld);
  cublasLtMatmulDescDestroy(p.desc);
}

struct Searcher {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;

  bool launch(const Product& p, const cublasLtMatmulAlgo_t& algo) const {
    const float one = 1, zero = 0;
    return cublasLtMatmul(handle, p.desc, &one, p.a, p.la, p.b, p.lb, &zero, p.d, p.ld, p.d, p.ld, &algo, workspace,
                          kWorkspaceBytes, nullptr) == CUBLAS_STATUS_SUCCESS;
  }

  // Milliseconds a launch over `launches` back to back after one warm-up; negative if it refuses.
  float time(const Product& p, const cublasLtMatmulAlgo_t& algo, int launches) const {
    if (!launch(p, algo)) return -1;
    check(cudaEventRecord(start), "cudaEventRecord");
    for (int r = 0; r < launches; ++r)
      if (!launch(p, algo)) return -1;
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return ms / static_cast<float>(launches);
  }

  // The heuristic's first kHeuristicCandidates algorithms for the product.
  std::vector<cublasLtMatmulAlgo_t> heuristic(const Product& p) const {
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t bytes = kWorkspaceBytes;
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes),
          "MAX_WORKSPACE_BYTES");
    std::vector<cublasLtMatmulHeuristicResult_t> found(kHeuristicCandidates);
    int count = 0;
    std::vector<cublasLtMatmulAlgo_t> algos;
    if (cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.la, p.lb, p.ld, p.ld, pref, kHeuristicCandidates, found.data(),
                                       &count) == CUBLAS_STATUS_SUCCESS) {
      for (int i = 0; i < count; ++i)
        if (found[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS)
          algos.push_back(found[static_cast<size_t>(i)].algo);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return algos;
  }
};

// The configuration `c` for `p`, if cuBLASLt accepts it there (its workspace within the limit).
std::optional<cublasLtMatmulAlgo_t> configured(const Searcher& s, const Product& p, const Config& c) {
  cublasLtMatmulAlgo_t algo{};
  if (cublasLtMatmulAlgoInit(s.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF,
                             CUDA_R_16BF, c.id, &algo) != CUBLAS_STATUS_SUCCESS)
    return std::nullopt;
  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof c.tile);
  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages, sizeof c.stages);
  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c.cluster, sizeof c.cluster);
  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &c.inner, sizeof c.inner);
  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c.swizzle, sizeof c.swizzle);
  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c.custom, sizeof c.custom);
  cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c.split_k, sizeof c.split_k);
  cublasLtMatmulHeuristicResult_t result{};
  if (cublasLtMatmulAlgoCheck(s.handle, p.desc, p.la, p.lb, p.ld, p.ld, &algo, &result) != CUBLAS_STATUS_SUCCESS ||
      result.workspaceSize > kWorkspaceBytes)
    return std::nullopt;
  return algo;
}

// Every configuration of `base`'s algorithm id that cuBLASLt accepts for the product (split-K off).
std::vector<cublasLtMatmulAlgo_t> neighbourhood(const Searcher& s, const Product& p, const cublasLtMatmulAlgo_t& base) {
  const std::vector<uint32_t> tiles = capabilityList(base, CUBLASLT_ALGO_CAP_TILE_IDS);
  const std::vector<uint32_t> stages = capabilityList(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
  const int32_t custom_max = capabilityValue(base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX);
  const bool swizzles = capabilityValue(base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT) != 0;
  // Cluster shapes of up to four blocks, and cuBLASLt's own choice (AUTO).
  const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO,  CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                               CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1,
                               CUBLASLT_CLUSTER_SHAPE_1x4x1};
  Config c = configOf(base);
  c.split_k = 1;
  std::vector<cublasLtMatmulAlgo_t> accepted;
  for (const uint32_t tile : tiles) {
    for (const uint32_t stage : stages) {
      for (const uint16_t cluster : clusters) {
        for (uint32_t swizzle = 0; swizzle <= (swizzles ? 1u : 0u); ++swizzle) {
          for (uint32_t custom = 0; custom <= static_cast<uint32_t>(custom_max); ++custom) {
            c.tile = tile;
            c.stages = stage;
            c.cluster = cluster;
            c.swizzle = swizzle;
            c.custom = custom;
            if (const std::optional<cublasLtMatmulAlgo_t> algo = configured(s, p, c)) accepted.push_back(*algo);
          }
        }
      }
    }
  }
  return accepted;
}

// The heuristic's configurations for the product with each of the four transpose pairs (the
// kernels cuBLASLt picks for the same shape with its operands laid out otherwise).
std::vector<Config> siblingConfigs(const Searcher& s, const Product& p) {
  std::vector<Config> configs;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      Product sibling = p;
      sibling.transpose_a = ta;
      sibling.transpose_b = tb;
      describeProduct(sibling);
      for (const cublasLtMatmulAlgo_t& algo : s.heuristic(sibling)) configs.push_back(configOf(algo));
      releaseProduct(sibling);
    }
  }
  return configs;
}

// The strategies compared, each a candidate set growing on the one before: the heuristic's eight
// (meshfuse's autotuner today); with the siblings' configurations; with every product's heuristic
// configurations (a pool a process would gather as it tunes); with an even sample of every
// configuration of the heuristic's algorithm id.
constexpr const char* kStrategies[] = {"heuristic 8", "+ siblings", "+ pool", "+ enumerated"};
constexpr int kStrategyCount = 4;

struct Candidate {
  cublasLtMatmulAlgo_t algo;
  Config config;
  float ms;
  int strategy;
};

// Searches one product and prints its row: each strategy's best, retimed in alternating rounds.
void searchProduct(const Searcher& s, Product& p, const std::vector<Config>& pool, int budget) {
  std::map<std::array<int64_t, 8>, Candidate> seen;
  // Times `algo` unless a candidate of the same configuration was; true when it was new.
  auto consider = [&](const cublasLtMatmulAlgo_t& algo, int strategy, int launches) {
    const Config config = configOf(algo);
    if (seen.count(config.key())) return false;
    seen.emplace(config.key(), Candidate{algo, config, s.time(p, algo, launches), strategy});
    return true;
  };
  auto consider_config = [&](const Config& c, int strategy) {
    if (seen.count(c.key())) return false;
    const std::optional<cublasLtMatmulAlgo_t> algo = configured(s, p, c);
    return algo && consider(*algo, strategy, 3);
  };
  const std::vector<cublasLtMatmulAlgo_t> offered = s.heuristic(p);
  if (offered.empty()) {
    std::printf("| %s | no algorithm |\n", p.name);
    return;
  }
  for (const cublasLtMatmulAlgo_t& algo : offered) consider(algo, 0, 5);
  int added[kStrategyCount] = {static_cast<int>(seen.size()), 0, 0, 0};
  for (const Config& c : siblingConfigs(s, p)) added[1] += consider_config(c, 1) ? 1 : 0;
  for (const Config& c : pool) added[2] += consider_config(c, 2) ? 1 : 0;
  // An even sample (every stride-th) of the heuristic's first algorithm's accepted configurations.
  const std::vector<cublasLtMatmulAlgo_t> space = neighbourhood(s, p, offered.front());
  const size_t stride = std::max<size_t>(1, space.size() / static_cast<size_t>(std::max(budget, 1)));
  for (size_t i = 0; i < space.size() && added[3] < budget; i += stride) added[3] += consider(space[i], 3, 2) ? 1 : 0;

  // Each strategy's best (over its own and the earlier strategies' candidates), retimed together.
  std::vector<const Candidate*> finalists;
  for (int strategy = 0; strategy < kStrategyCount; ++strategy) {
    const Candidate* best = nullptr;
    for (const auto& [key, c] : seen)
      if (c.ms > 0 && c.strategy <= strategy && (best == nullptr || c.ms < best->ms)) best = &c;
    finalists.push_back(best);
  }
  std::vector<std::vector<float> > rounds(finalists.size());
  for (int round = 0; round < 5; ++round)
    for (size_t i = 0; i < finalists.size(); ++i) rounds[i].push_back(s.time(p, finalists[i]->algo, 5));
  auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // The enumerated best's result against the heuristic's (both fp32 accumulation, split-K off).
  const size_t elements = static_cast<size_t>(p.rows * p.cols);
  check(s.launch(p, finalists.front()->algo) ? 0 : 1, "heuristic launch");
  const std::vector<float> reference = hostFloats(p.d, elements);
  check(s.launch(p, finalists.back()->algo) ? 0 : 1, "best launch");
  const std::vector<float> result = hostFloats(p.d, elements);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < elements; ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(result[i] - reference[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(reference[i])));
  }
  const double flop = 2.0 * static_cast<double>(p.rows) * static_cast<double>(p.cols) * static_cast<double>(p.depth);
  const float heuristic_ms = median(rounds[0]);
  // How common the fastest kernels are: the candidates whose first timing was within 2% of the best's.
  int near_best = 0;
  for (const auto& [key, c] : seen) near_best += c.ms > 0 && c.ms <= finalists.back()->ms * 1.02f ? 1 : 0;
  std::printf("| %s | %.3f (%.0f TFLOP/s) |", p.name, heuristic_ms, flop / heuristic_ms / 1e9);
  for (size_t i = 1; i < finalists.size(); ++i)
    std::printf(" %.3fx (%d new) |", heuristic_ms / median(rounds[i]), added[i]);
  std::printf(" %s | %d of %zu | %.2g |\n", describe(finalists.back()->config).c_str(), near_best, seen.size(),
              worst / std::max(scale, 1e-30));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t m = argc > 1 ? std::stoll(argv[1]) : 2048;
  const int64_t e = argc > 2 ? std::stoll(argv[2]) : 12288;
  const int budget = argc > 3 ? std::stoi(argv[3]) : 400;
  Searcher s;
  check(cublasLtCreate(&s.handle), "cublasLtCreate");
  check(cudaMalloc(&s.workspace, kWorkspaceBytes), "cudaMalloc");
  check(cudaEventCreate(&s.start), "cudaEventCreate");
  check(cudaEventCreate(&s.stop), "cudaEventCreate");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("# %s, cuBLASLt %zu; the layer's GEMMs at tokens=%lld e=%lld, bf16, fp32 compute\n", prop.name,
              cublasLtGetVersion(), static_cast<long long>(m), static_cast<long long>(e));
  std::printf(
      "# ms: medians of 5 alternating rounds of 5 launches; ratios: the heuristic's best over each strategy's "
      "best; error: max |enumerated best - heuristic's| / max |heuristic's|\n| product | heuristic's best ms |");
  for (int i = 1; i < kStrategyCount; ++i) std::printf(" %s |", kStrategies[i]);
  std::printf(" the best configuration | within 2%% | error |\n|---|---|---|---|---|---|---|---|\n");
  struct Linear {
    const char* name;
    int64_t n, k;  // W [n, k]: outputs by inputs, row-major as torch's linear
  };
  const Linear linears[] = {{"qkv", 3 * e, e}, {"out-proj", e, e}, {"fc1", 4 * e, e}, {"fc2", e, 4 * e}};
  std::vector<std::string> names;
  std::vector<Product> products;
  std::vector<void*> buffers;
  for (const Linear& w : linears) {
    void* x = deviceCopy(randomBf16(static_cast<size_t>(m * w.k), 1));
    void* weight = deviceCopy(randomBf16(static_cast<size_t>(w.n * w.k), 2));
    void* dy = deviceCopy(randomBf16(static_cast<size_t>(m * w.n), 3));
    void* out = nullptr;
    check(cudaMalloc(&out, static_cast<size_t>(std::max({m * w.n, m * w.k, w.n * w.k})) * sizeof(__nv_bfloat16)),
          "cudaMalloc");
    buffers.insert(buffers.end(), {x, weight, dy, out});
    // Row-major [r, c] is column-major [c, r]. y [m, n] = x W^T: D [n, m] = W^T(col [k, n], T) * x (col [k, m]).
    products.push_back(Product{nullptr, w.n, m, w.k, true, false, weight, x, out});
    names.push_back(std::string(w.name) + " y=xW^T");
    // dx [m, k] = dy [m, n] W [n, k]: D [k, m] = W (col [k, n]) * dy (col [n, m]).
    products.push_back(Product{nullptr, w.k, m, w.n, false, false, weight, dy, out});
    names.push_back(std::string(w.name) + " dx=dyW");
    // dW [n, k] = dy^T x: D [k, n] = x (col [k, m]) * dy^T (col [n, m], T).
    products.push_back(Product{nullptr, w.k, w.n, m, false, true, x, dy, out});
    names.push_back(std::string(w.name) + " dW=dy^Tx");
  }
  // The pool: every product's heuristic configurations.
  std::vector<Config> pool;
  for (size_t i = 0; i < products.size(); ++i) {
    products[i].name = names[i].c_str();
    describeProduct(products[i]);
    for (const cublasLtMatmulAlgo_t& algo : s.heuristic(products[i])) pool.push_back(configOf(algo));
  }
  for (Product& p : products) {
    searchProduct(s, p, pool, budget);
    releaseProduct(p);
  }
  for (void* ptr : buffers) cudaFree(ptr);
  cudaEventDestroy(s.start);
  cudaEventDestroy(s.stop);
  cudaFree(s.workspace);
  cublasLtDestroy(s.handle);
  return 0;
}

#include "runtime/cuda/attention_plans.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/cuda/launch_timing.h"
#include "runtime/tensor.h"

namespace meshfuse::cuda {

namespace fe = cudnn_frontend;

namespace {
// Launches of each plan timed (after one warm-up): few, since the graphs that matter take
// milliseconds; and the most workspace a plan may ask for (a fallback engine may want a
// [b, h, s, s] fp32 score matrix: 1.6 GB at the GPT-3 layer's shape).
constexpr int kTuneRepeats = 3;
constexpr int64_t kMaxTuneWorkspace = int64_t{2} << 30;

bool tuneLogEnabled() {
  static const bool enabled = std::getenv("MESHFUSE_ATTENTION_TUNE_LOG") != nullptr;
  return enabled;
}

}  // namespace

void checkCudnn(fe::error_t status, const std::string& what) {
  if (status.is_bad()) throw std::runtime_error("cuDNN attention: " + what + " failed: " + status.get_message());
}

bool attentionAutotuneEnabled() {
  const char* v = std::getenv("MESHFUSE_ATTENTION_AUTOTUNE");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

void createAttentionPlans(fe::graph::Graph& graph, cudnnHandle_t handle, bool tune) {
  if (!tune) {
    checkCudnn(graph.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
    checkCudnn(graph.check_support(handle), "check_support");
    checkCudnn(graph.build_plans(handle), "build_plans");
    return;
  }
  // Every engine configuration the heuristics know of; a mode that offers none is not an error.
  if (graph.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}).is_bad())
    checkCudnn(graph.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  checkCudnn(graph.check_support(handle), "check_support");
  checkCudnn(graph.build_plans(handle, fe::BuildPlanPolicy_t::ALL), "build_plans");
}

void tuneAttentionPlan(AttentionPlan& plan, fe::graph::Graph& graph, cudnnHandle_t handle, AttentionPack& pack,
                       int device, cudaStream_t stream, const std::string& what) {
  if (streamCapturing(stream)) return;
  const int64_t count = graph.get_execution_plan_count();
  std::vector<int64_t> workspaces(static_cast<size_t>(std::max<int64_t>(count, 0)), -1);
  int64_t most = 0;
  for (int64_t i = 0; i < count; ++i) {
    int64_t bytes = 0;
    if (graph.get_workspace_size_plan_at_index(i, bytes).is_good() && bytes <= kMaxTuneWorkspace) {
      workspaces[static_cast<size_t>(i)] = bytes;
      most = std::max(most, bytes);
    }
  }
  Tensor workspace = Tensor::empty({(most + 7) / 8 + 1}, DataType::Int, Device::cuda(device));
  float best_ms = std::numeric_limits<float>::infinity();
  std::string times;
  for (int64_t i = 0; i < count; ++i) {
    if (workspaces[static_cast<size_t>(i)] < 0) continue;  // no size, or more workspace than allowed
    // A plan that was not built or refuses these tensors fails (in its warm-up or later) and is skipped.
    const std::optional<float> ms = timeLaunches(
        stream, kTuneRepeats, [&] { return graph.execute_plan_at_index(handle, pack, workspace.data(), i).is_good(); });
    char entry[64];
    if (ms)
      std::snprintf(entry, sizeof entry, " %lld:%.3f", static_cast<long long>(i), *ms);
    else
      std::snprintf(entry, sizeof entry, " %lld:failed", static_cast<long long>(i));
    times += entry;
    if (!ms) {
      cudaGetLastError();  // what the failed plan left
      continue;
    }
    if (*ms < best_ms) {
      best_ms = *ms;
      plan.index = i;
      plan.workspace = workspaces[static_cast<size_t>(i)];
    }
  }
  if (tuneLogEnabled())
    std::fprintf(stderr, "[meshfuse] attention %s: %lld plans, ms by index:%s; chosen %lld\n", what.c_str(),
                 static_cast<long long>(count), times.c_str(), static_cast<long long>(plan.index));
}

}  // namespace meshfuse::cuda

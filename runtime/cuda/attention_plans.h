// Which of cuDNN's execution plans runs a fused-attention graph. By default the frontend's heuristics
// pick one plan (mode A, the first that builds). MESHFUSE_ATTENTION_AUTOTUNE=1 builds every plan the
// heuristics (modes A and FALLBACK) offer and times each on the graph's first call, with that call's
// own tensors, keeping the fastest: the custom-mask backward that meshfuse's dropout mask needs ran
// 3.2x cuDNN's in-kernel-dropout one on the H100 with the heuristics' plan (BENCHMARKS.md), and the
// plans beside it had not been timed. MESHFUSE_ATTENTION_TUNE_LOG=1 prints each plan's time to stderr.
// Needs cuDNN and its frontend (included by the one file that runs attention).
#pragma once
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace meshfuse::cuda {

// Throws std::runtime_error naming `what` (a frontend call) and cuDNN's message when `status` is bad.
void checkCudnn(cudnn_frontend::error_t status, const std::string& what);

// MESHFUSE_ATTENTION_AUTOTUNE: 1 times every plan, 0 (the default) keeps the heuristics' choice.
// Read at each call (a graph is cached per setting), so that a test can turn it on.
bool attentionAutotuneEnabled();

// The heuristic modes and build policy a graph's plans are created with (all of them when tuning).
void createAttentionPlans(cudnn_frontend::graph::Graph& graph, cudnnHandle_t handle, bool tune);

// A graph's plan, once chosen: -1 until then (the heuristics' choice runs); the index of the fastest
// after tuning; and the workspace the chosen plan needs.
struct AttentionPlan {
  std::once_flag tuned;
  int64_t index = -1;
  int64_t workspace = 0;
};

using AttentionPack = std::unordered_map<std::shared_ptr<cudnn_frontend::graph::Tensor_attributes>, void*>;

// Times every built plan of `graph` on `pack` (its outputs are overwritten, as the call does anyway)
// on `stream`, with a workspace from meshfuse's allocator on `device`, and records the fastest in
// `plan`. Nothing is timed while the stream is being captured into a CUDA graph (the heuristics'
// plan then stays). `what` names the graph in the log line.
void tuneAttentionPlan(AttentionPlan& plan, cudnn_frontend::graph::Graph& graph, cudnnHandle_t handle,
                       AttentionPack& pack, int device, cudaStream_t stream, const std::string& what);

}  // namespace meshfuse::cuda

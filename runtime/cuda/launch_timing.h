// Timing launches with CUDA events, for the one-off tuning of the schedulers that pick among
// variants by measuring them on a call's own tensors (cuBLASLt algorithms in matmul.cpp, cuDNN plans
// in attention_plans.cpp, the normalization split in normalization.cpp). CUDA-free header.
#pragma once
#include <functional>
#include <optional>

#include "runtime/cuda/streams.h"

namespace meshfuse::cuda {

// Whether `stream` is being captured into a CUDA graph (or cannot say): tuning synchronizes, which
// a capture does not allow, so it is skipped there.
bool streamCapturing(Stream stream);

// The mean milliseconds of `repeats` calls of `launch` (which enqueues on `stream` and returns
// whether it could) after one untimed warm-up call; nullopt when a call returned false.
std::optional<float> timeLaunches(Stream stream, int repeats, const std::function<bool()>& launch);

}  // namespace meshfuse::cuda

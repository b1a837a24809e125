// Where attention's gradients go when q, k, v are heads of one fused projection, shared by the CPU
// kernel (runtime/cpu/attention.cpp) and the cuDNN one (runtime/cuda/attention.cpp): dq, dk, dv
// written with q's, k's and v's strides into one buffer laid out as the projection, so that the cat
// joining them into the projection's gradient is a view (view_ops.h), not three copies.
#pragma once
#include <optional>
#include <vector>

#include "runtime/tensor.h"

namespace meshfuse {

// One buffer for dq, dk, dv: `elements` from the lowest input's first element, which sits at
// `byte_offset` of the inputs' storage.
struct GradientBuffer {
  int64_t elements = 0;
  int64_t byte_offset = 0;
};

// The buffer when q, k, v are 4-D views of one storage that share a dtype, shape and strides, have a
// contiguous last axis, and lie side by side within each of their rows (q's head dim, then k's, then
// v's, before the next row at the smallest outer stride, as the heads of a fused qkv projection do):
// then their gradients can take the same places without touching one another's elements. None
// otherwise (self-attention given one tensor as q and k, say).
std::optional<GradientBuffer> gradientBufferLike(const Tensor& q, const Tensor& k, const Tensor& v);

// dq, dk, dv: views of a fresh buffer (of `dtype` on `device`) at q's, k's and v's places.
std::vector<Tensor> gradientViews(const GradientBuffer& buffer, const Tensor& q, const Tensor& k, const Tensor& v,
                                  DataType dtype, Device device);

}  // namespace meshfuse

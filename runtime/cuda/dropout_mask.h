// The dropout mask of fused attention on CUDA, generated with meshfuse's Philox (runtime/philox.h)
// so that it is the CPU kernel's mask bit for bit: element (b, h, i, j) is kept where the Philox
// uniform of its global index g (AttentionParams::dropoutIndex: word g % 4 of counter g / 4) is
// >= dropout_p. A thread draws a counter and writes its four elements. cuDNN's own
// in-kernel dropout derives its mask from Philox in a layout of its own that is not documented,
// so it cannot be matched on the CPU; cuDNN takes this mask as its custom-mask input instead.
//
// A kept element holds the keep scale 1 / (1 - p) itself, and the graph's dropout scales are 1.
// Measured on the H200 (cuDNN 9.19, frontend 1.32): with a 0/1 mask and scale 1 / (1 - p), the
// forward and dV were right but dQ and dK were not: the backward's dS came out as
// P * (Z * dP - D / (1 - p)) instead of P * (Z * dP - D) (D = rowsum(dO * O), Z the scaled mask;
// a least-squares fit of the factor on D gave 1.2500 at p = 0.2 at every shape tried, and the
// dropout_scale_inv input changed nothing). With the scale in the mask and both scales 1, every
// gradient matched the float64 reference (tests/python/test_attention.py). CUDA-free header.
#pragma once
#include <string>

#include "runtime/attention_params.h"
#include "runtime/tensor.h"

namespace meshfuse::cuda {

// The mask kernel's CUDA source (NVRTC; exposed for the code generation tests).
std::string dropoutMaskSource();

// The mask's dtype for attention in `io` (Half or BFloat16): `io` when it holds the keep scale
// 1 / (1 - p) exactly (p = 0.5, 0.75, 0.2, ...), else Float, so that a kept element is scaled by
// exactly the float the CPU kernel uses (dropoutKeepScale; bf16 would round 1 / 0.9 by 0.16%).
DataType dropoutMaskDataType(double dropout_p, DataType io);
// With `narrow`, `io` always (half the bytes of a Float mask for the mask kernel to write and cuDNN
// to read): the mask then holds the keep scale rounded to `io`, and dropoutScaleCorrection is the
// factor cuDNN's dropout scale input multiplies back (keep scale / its rounding), so kept elements
// are scaled by the keep scale to float rounding. cuDNN's backward also multiplies its D term by
// that input (see above), off by the correction: 0.16% for bf16 at p = 0.1. The default is narrow
// (on the H200, GPT-3 attention shape, causal, p = 0.1: forward 87 -> 109 TFLOP/s, backward
// 60 -> 84, gradients within the float64 test's bounds); MESHFUSE_ATTENTION_NARROW_MASK=0 keeps
// the exact Float mask.
DataType dropoutMaskDataType(double dropout_p, DataType io, bool narrow);
float dropoutScaleCorrection(double dropout_p, DataType mask_dtype);

// A [batch, heads, seq_q, seq_kv] tensor of `dtype` (Half, BFloat16 or Float) on `device`: 0 where
// an element is dropped, the keep scale 1 / (1 - p) (rounded to `dtype`) where it is kept.
Tensor dropoutMask(int device, const AttentionParams& p, DataType dtype, const void* seed_at = nullptr,
                   const void* offset_at = nullptr);

// A 0-dim Int tensor on `device` holding `value`, written by a one-thread kernel on the current
// stream (a host-to-device copy from pageable memory would synchronize the stream).
Tensor deviceInt64Scalar(int device, int64_t value);
// That kernel's source (for the code generation tests).
std::string storeInt64Source();

}  // namespace meshfuse::cuda

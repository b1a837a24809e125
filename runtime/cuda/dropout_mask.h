// The dropout mask of fused attention on CUDA, generated with meshfuse's Philox (runtime/philox.h)
// so that it is the CPU kernel's mask bit for bit: element (b, h, i, j) is kept where the Philox
// uniform of its global index g (AttentionParams::dropoutIndex: word g % 4 of counter g / 4) is
// >= dropout_p. A thread draws two counters and writes their eight elements. cuDNN's own
// in-kernel dropout derives its mask from Philox in a layout of its own that is not documented,
// so it cannot be matched on the CPU; under MESHFUSE_ATTENTION_RNG=meshfuse cuDNN takes this mask as
// its custom-mask input instead of drawing its own (the default: attention_rng.h says what each costs).
//
// How a kept element is scaled by 1 / (1 - p) (MaskWidth): the mask holds the keep scale rounded to
// the attention's dtype and cuDNN's dropout scale input carries what rounding left. A one-byte 0/1
// mask (the whole keep scale in that input) was tried and withdrawn: on the H100 (cuDNN 9.19,
// frontend 1.32, session 15) cuDNN's backward, given a mask declared UINT8, applied it as if every
// element were dropped (least-squares fits of dV and of dQ's mask term gave factors of 0.0000 where
// 1 / (1 - p) is right, while the forward applied the same mask correctly), and it read 330-element
// rows at misaligned addresses: it reads the mask wider than one byte. The probe that measured it is
// scripts/attention-byte-probe.py in commit ded5096. CUDA-free header.
#pragma once
#include <string>
#include <utility>

#include "runtime/attention_params.h"
#include "runtime/tensor.h"

namespace meshfuse::cuda {

// The mask kernel's CUDA source (NVRTC; exposed for the code generation tests).
std::string dropoutMaskSource();

// What the mask cuDNN reads holds: Narrow, the keep scale rounded to the attention's dtype (bf16 rounds
// 1 / 0.9 by 0.16%); Exact, the keep scale in the attention's dtype where it holds it exactly (p = 0.5,
// 0.75, 0.2, ...), else in fp32. MESHFUSE_ATTENTION_MASK=narrow|exact picks it, read at each call.
// Narrow is the default (on the H200, GPT-3 attention shape, causal, p = 0.1: forward 87 -> 109
// TFLOP/s and backward 60 -> 84 against Exact, gradients within the float64 tests' bounds).
enum class MaskWidth { Narrow, Exact };
MaskWidth maskWidthFromEnvironment();

// The mask's dtype for attention in `io` (Half or BFloat16): `io` or Float, as above.
DataType dropoutMaskDataType(double dropout_p, DataType io);  // the environment's width
DataType dropoutMaskDataType(double dropout_p, DataType io, MaskWidth width);
// What cuDNN's dropout scale input multiplies a kept element of a `mask_dtype` mask by, so that it is
// scaled by the keep scale to float rounding: the keep scale over its rounding to a Half/BFloat16
// mask, 1 for an exact mask.
float dropoutScaleCorrection(double dropout_p, DataType mask_dtype);

// How the mask's elements lie in memory. QueryMajor: row-major [batch, heads, seq_q, seq_kv], the
// order cuDNN's forward reads. KeyMajor: [batch, heads, seq_kv, seq_q] memory (the tensor is its
// permuted view), the order of cuDNN's backward, which walks the transposed score tiles.
// MESHFUSE_ATTENTION_BACKWARD_MASK=key_major|query_major picks the backward's, read at each call.
// Default query_major: on the H100 (GPT-3 attention, session 19) cuDNN's backward read a key-major
// mask 0.22 ms faster (2.82 -> 2.60 ms; still 3x its in-kernel dropout's, so the read order is not
// what makes it slow), but the tiled kernel drawing it took 1.22 ms against the row kernel's 0.70
// (session 20: 0.94-1.01 ms against 0.42, bench_cuda_ops --mask).
enum class MaskOrder { QueryMajor, KeyMajor };
MaskOrder backwardMaskOrderFromEnvironment();

// A [batch, heads, seq_q, seq_kv] tensor of `dtype` on `device`: 0 where an element is dropped; where
// it is kept, the keep scale 1 / (1 - p) rounded to `dtype` (Half, BFloat16, Float). KeyMajor
// returns the permuted view of a [batch, heads, seq_kv, seq_q] buffer.
Tensor dropoutMask(int device, const AttentionParams& p, DataType dtype, const void* seed_at = nullptr,
                   const void* offset_at = nullptr, MaskOrder order = MaskOrder::QueryMajor);

// The forward's 0-dim Int outputs philox_seed and philox_offset on `device`, 16-byte aligned views
// of one buffer written by a one-thread kernel on the current stream: one launch for both (a
// host-to-device copy from pageable memory would synchronize the stream; two launches cost the
// shortest attention calls, 0.3 ms on the H100, about 1% more). The kernel is
// attention_rng.h's cudnnPhiloxWords with no shard key.
std::pair<Tensor, Tensor> devicePhiloxScalars(int device, int64_t seed, int64_t offset);

}  // namespace meshfuse::cuda

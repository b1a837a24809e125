// The dropout mask of fused attention on CUDA, generated with meshfuse's Philox (runtime/philox.h)
// so that it is the CPU kernel's mask bit for bit: element (b, h, i, j) is kept where the Philox
// uniform of its global index g (AttentionParams::dropoutIndex: word g % 4 of counter g / 4) is
// >= dropout_p. A thread draws a counter and writes its four elements. cuDNN's own
// in-kernel dropout derives its mask from Philox in a layout of its own that is not documented,
// so it cannot be matched on the CPU; cuDNN takes this mask as its custom-mask input instead.
//
// How a kept element is scaled by 1 / (1 - p) (MaskWidth): by default the mask holds the keep scale
// rounded to the attention's dtype and cuDNN's dropout scale input carries what rounding left; a
// one-byte 0/1 mask may instead leave the whole keep scale to that input. cuDNN's backward also
// multiplies its D term (rowsum(dO * O)) by the dropout scale: measured on the H200 (cuDNN 9.19,
// frontend 1.32), a 0/1 mask with scale 1 / (1 - p) gave a right forward and dV but
// dS = P * (Z * dP - D / (1 - p)) instead of P * (Z * dP - D) (a least-squares fit of the factor on D
// gave 1.2500 at p = 0.2 at every shape tried), and the dropout_scale_inv input, the frontend's way to
// undo it, changed nothing. Behind a byte mask the backward therefore hands cuDNN O divided by the
// dropout scale (outputForDropoutBackward): O is read only for D, which comes out right. CUDA-free
// header.
#pragma once
#include <string>

#include "runtime/attention_params.h"
#include "runtime/tensor.h"

namespace meshfuse::cuda {

// The mask kernel's CUDA source (NVRTC; exposed for the code generation tests).
std::string dropoutMaskSource();

// What the mask cuDNN reads holds: Byte, 0 or 1 in a Bool (one byte) tensor; Narrow, the keep scale
// rounded to the attention's dtype (bf16 rounds 1 / 0.9 by 0.16%); Exact, the keep scale in the
// attention's dtype where it holds it exactly (p = 0.5, 0.75, 0.2, ...), else in fp32.
// MESHFUSE_ATTENTION_MASK=narrow|byte|exact picks it, read at each call. Narrow is the default (on the
// H200, GPT-3 attention shape, causal, p = 0.1: forward 87 -> 109 TFLOP/s and backward 60 -> 84 against
// Exact, gradients within the float64 tests' bounds). Byte halves the bytes again; it is built and its
// kernels compile, but it has not yet run on a GPU (none could be had in sessions 12-13): the GPU tests run it
// beside Narrow (tests/python/test_attention.py), and it becomes the default once they pass.
enum class MaskWidth { Byte, Narrow, Exact };
MaskWidth maskWidthFromEnvironment();

// The mask's dtype for attention in `io` (Half or BFloat16): Bool, `io` or Float, as above.
DataType dropoutMaskDataType(double dropout_p, DataType io);  // the environment's width
DataType dropoutMaskDataType(double dropout_p, DataType io, MaskWidth width);
// What cuDNN's dropout scale input multiplies a kept element of a `mask_dtype` mask by, so that it is
// scaled by the keep scale to float rounding: the keep scale itself for a Bool mask, the keep scale
// over its rounding to a Half/BFloat16 mask, 1 for an exact mask.
float dropoutScaleCorrection(double dropout_p, DataType mask_dtype);

// The elements from one mask row to the next: seq_kv, except that a Bool mask's rows start at 16-byte
// multiples (cuDNN's backward read a one-byte mask of 330-element rows at a misaligned address on the
// H100, where a bf16 mask of the same shape ran).
int64_t dropoutMaskRowStride(int64_t seq_kv, DataType dtype);

// A [batch, heads, seq_q, seq_kv] tensor of `dtype` on `device` with rows dropoutMaskRowStride apart
// (a view of the padded buffer): 0 where an element is dropped; where it is kept, 1 (Bool) or the keep
// scale 1 / (1 - p) rounded to `dtype` (Half, BFloat16, Float).
Tensor dropoutMask(int device, const AttentionParams& p, DataType dtype, const void* seed_at = nullptr,
                   const void* offset_at = nullptr);

// The forward's output `out` (4-D, BFloat16 or Half, any strides) divided by `dropout_scale`, dense,
// for the backward's "o" input (see above); its kernel's source for the code generation tests.
Tensor outputForDropoutBackward(int device, const Tensor& out, float dropout_scale);
std::string scaledOutputSource();

// A 0-dim Int tensor on `device` holding `value`, written by a one-thread kernel on the current
// stream (a host-to-device copy from pageable memory would synchronize the stream).
Tensor deviceInt64Scalar(int device, int64_t value);
// That kernel's source (for the code generation tests).
std::string storeInt64Source();

}  // namespace meshfuse::cuda

#include "runtime/cuda/dropout_mask.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "ir/ir.h"
#include "runtime/cuda/attention_rng.h"
#include "runtime/cuda/kernel_cache.h"
#include "runtime/cuda/pointwise_codegen.h"
#include "runtime/cuda/streams.h"
#include "runtime/half.h"

namespace meshfuse::cuda {

namespace {

// The kernel around pointwise_codegen's Philox (the one source of the CUDA rounds, kept in step with
// runtime/philox.h): element g of the global mask is kept where the 24-bit uniform of word g % 4 of
// counter g / 4 is >= p, as uniform() draws it.
const char* const kKernel = R"(
struct Params {
  void* mask;
  unsigned long long seed, offset;
  const unsigned long long* seed_at;    // when set, the seed and offset are read from device memory
  const unsigned long long* offset_at;  // (the forward's 0-dim outputs), with no host round trip
  long long heads, seq_q, seq_kv, batch_offset, head_offset, global_heads, numel;
  unsigned int keep_from;  // a Philox word at or above it is kept: its 24-bit uniform is >= dropout_p
  unsigned int kept;   // the bits a kept element gets (of a 2- or 4-byte element)
  int element_bytes;
  int causal;          // top-left causal: (i, j) with j > i is masked out
  int vector_stores;   // the mask's address is 16-byte aligned: aligned groups store as one vector
};
__device__ __forceinline__ void storeMaskGroup(const Params& p, long long e, long long j0, const unsigned bits[4]) {
  if (p.vector_stores && j0 >= 0 && j0 + 4 <= p.seq_kv && (e & 3) == 0) {
    if (p.element_bytes == 4)
      reinterpret_cast<uint4*>(p.mask)[e >> 2] = make_uint4(bits[0], bits[1], bits[2], bits[3]);
    else
      reinterpret_cast<uint2*>(p.mask)[e >> 2] = make_uint2(bits[0] | (bits[1] << 16), bits[2] | (bits[3] << 16));
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (j0 + k < 0 || j0 + k >= p.seq_kv) continue;
    if (p.element_bytes == 4)
      static_cast<unsigned int*>(p.mask)[e + k] = bits[k];
    else
      static_cast<unsigned short*>(p.mask)[e + k] = static_cast<unsigned short>(bits[k]);
  }
}
// Two counters' eight elements from element e (the row's key j0): one 16-byte store (two for fp32)
// where all eight lie in the row and e is 8-element aligned, else as two groups of four.
__device__ __forceinline__ void storeMaskGroups(const Params& p, long long e, long long j0, const unsigned bits[8]) {
  if (p.vector_stores && j0 >= 0 && j0 + 8 <= p.seq_kv && (e & 7) == 0) {
    if (p.element_bytes == 4) {
      uint4* out = reinterpret_cast<uint4*>(p.mask) + (e >> 2);
      out[0] = make_uint4(bits[0], bits[1], bits[2], bits[3]);
      out[1] = make_uint4(bits[4], bits[5], bits[6], bits[7]);
    } else {
      reinterpret_cast<uint4*>(p.mask)[e >> 3] = make_uint4(bits[0] | (bits[1] << 16), bits[2] | (bits[3] << 16),
                                                            bits[4] | (bits[5] << 16), bits[6] | (bits[7] << 16));
    }
    return;
  }
  storeMaskGroup(p, e, j0, bits);
  storeMaskGroup(p, e + 4, j0 + 4, bits + 4);
}
// The Philox key and offset: the parameters', or from device memory where the call passes them so.
// Held in registers (writing them into the kernel's parameter struct would copy it to local memory).
struct Key {
  unsigned long long seed, offset;
};
__device__ __forceinline__ Key loadKey(const Params& p) {
  return p.seed_at != nullptr ? Key{*p.seed_at, *p.offset_at} : Key{p.seed, p.offset};
}
// The global index of element (0, 0) of local (batch, head) pair bh.
__device__ __forceinline__ unsigned long long pairBase(const Params& p, long long bh) {
  const long long h = bh % p.heads, b = bh / p.heads;
  return ((unsigned long long)(b + p.batch_offset) * p.global_heads + (h + p.head_offset)) * p.seq_q * p.seq_kv;
}
// The bits of the four elements of Philox counter `counter`, whose word 0 is the row's key j0 (< 0:
// the row before's): kept where the key is below `computed` (the keys a causal row sees) and its
// uniform is >= p, compared as integers (keepFrom on the host says why that is the same test); a
// counter past `computed` gets 0 without its draw.
__device__ __forceinline__ void keepBits(const Params& p, const Key& key, unsigned long long counter, long long j0,
                                         long long computed, unsigned bits[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) bits[k] = 0u;
  if (j0 >= computed) return;
  const uint4 r = philox4x32(counter, key.offset, key.seed);
  const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (j0 + k < computed && w[k] >= p.keep_from) bits[k] = p.kept;
}
extern "C" __global__ void meshfuse_dropout_mask(const Params p) {
  const Key key = loadKey(p);
  // The grid's y walks the (batch, head) pairs and its x the query rows i of a pair, so a block
  // divides out a pair's indices once rather than every thread per row (64-bit division is a long
  // instruction sequence). A thread takes two Philox counters at a time: their eight words are the
  // mask of eight consecutive global elements, so a row of seq_kv elements starting at word `lead`
  // of its first counter spans (lead + seq_kv + 3) / 4 counters, the first and last maybe shared
  // with the neighbouring rows (each row draws them and keeps its own words). Under a causal mask a
  // counter whose elements all lie past the diagonal (cuDNN multiplies them by a probability of 0)
  // gets 0 without its draw. On the H100 (GPT-3 mask, session 20) this takes 0.42 ms, 59% of a
  // memset's rate, with the integer ALU pipe the busiest (Nsight Compute); a persistent one-wave grid
  // with 32-bit row positions ran slower (more instructions: BENCHMARKS.md).
  const long long pairs = p.numel / (p.seq_q * p.seq_kv);
  for (long long bh = blockIdx.y; bh < pairs; bh += gridDim.y) {
    const unsigned long long pair_base = pairBase(p, bh);
    for (long long i = blockIdx.x; i < p.seq_q; i += gridDim.x) {
      const long long row = bh * p.seq_q + i;
      const unsigned long long base = pair_base + (unsigned long long)i * p.seq_kv;
      const long long computed = p.causal ? min(p.seq_kv, i + 1) : p.seq_kv;
      const unsigned long long first = base >> 2;
      const long long lead = static_cast<long long>(base & 3);
      const long long counters = (lead + p.seq_kv + 3) >> 2;
      for (long long t = 2 * threadIdx.x; t < counters; t += 2 * blockDim.x) {
        const long long j0 = 4 * t - lead;  // the row position of the counter's word 0 (< 0: the row before's)
        unsigned bits[8];
        keepBits(p, key, first + t, j0, computed, bits);
        keepBits(p, key, first + t + 1, j0 + 4, computed, bits + 4);  // past the row: 0, not drawn
        storeMaskGroups(p, row * p.seq_kv + j0, j0, bits);
      }
    }
  }
}
// The same mask held key-major: element (b, h, i, j) at ((b * heads + h) * seq_kv + j) * seq_q + i,
// the order in which cuDNN's attention backward reads it (it walks the transposed score tiles). A block
// draws a [64 queries, 64 keys] tile row by row, as above (a row's counters from the one holding its
// key j_begin: at most 17), into shared memory, then writes it out by keys, each key's 64 queries
// contiguous (coalesced, two 2-byte elements a store where they are aligned).
#define MESHFUSE_MASK_TILE 64
#define MESHFUSE_MASK_ROW_COUNTERS 17
extern "C" __global__ void meshfuse_dropout_mask_key_major(const Params p) {
  __shared__ unsigned int tile[MESHFUSE_MASK_TILE][MESHFUSE_MASK_TILE + 1];  // [key][query], padded
  const Key key = loadKey(p);
  const long long pairs = p.numel / (p.seq_q * p.seq_kv);
  const long long tiles_k = (p.seq_kv + MESHFUSE_MASK_TILE - 1) / MESHFUSE_MASK_TILE;
  const long long tiles = (p.seq_q + MESHFUSE_MASK_TILE - 1) / MESHFUSE_MASK_TILE * tiles_k;
  for (long long bh = blockIdx.y; bh < pairs; bh += gridDim.y) {
    const unsigned long long pair_base = pairBase(p, bh);
    for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
      const long long i_begin = t / tiles_k * MESHFUSE_MASK_TILE, j_begin = t % tiles_k * MESHFUSE_MASK_TILE;
      const int rows = (int)min((long long)MESHFUSE_MASK_TILE, p.seq_q - i_begin);
      const int cols = (int)min((long long)MESHFUSE_MASK_TILE, p.seq_kv - j_begin);
      for (int s = threadIdx.x; s < MESHFUSE_MASK_TILE * MESHFUSE_MASK_ROW_COUNTERS; s += blockDim.x) {
        const int r = s / MESHFUSE_MASK_ROW_COUNTERS, c = s % MESHFUSE_MASK_ROW_COUNTERS;
        if (r >= rows) continue;
        const long long i = i_begin + r;
        const unsigned long long g0 = pair_base + (unsigned long long)i * p.seq_kv + j_begin;  // (i, j_begin)
        const int j_first = 4 * c - (int)(g0 & 3);  // the tile column of the counter's word 0
        if (j_first >= cols) continue;
        const long long computed = p.causal ? min(p.seq_kv, i + 1) : p.seq_kv;
        unsigned bits[4];
        keepBits(p, key, (g0 >> 2) + c, j_begin + j_first, computed, bits);
#pragma unroll
        for (int k = 0; k < 4; ++k)
          if (j_first + k >= 0 && j_first + k < cols) tile[j_first + k][r] = bits[k];
      }
      __syncthreads();
      const long long out_base = (bh * p.seq_kv + j_begin) * p.seq_q + i_begin;
      for (int s = threadIdx.x; s < MESHFUSE_MASK_TILE * MESHFUSE_MASK_TILE / 2; s += blockDim.x) {
        const int jj = s / (MESHFUSE_MASK_TILE / 2), r = 2 * (s % (MESHFUSE_MASK_TILE / 2));
        if (jj >= cols || r >= rows) continue;
        const long long e = out_base + (long long)jj * p.seq_q + r;
        if (p.element_bytes == 2 && p.vector_stores && r + 1 < rows && (e & 1) == 0) {
          reinterpret_cast<unsigned int*>(p.mask)[e >> 1] = tile[jj][r] | (tile[jj][r + 1] << 16);
          continue;
        }
        for (int k = 0; k < 2 && r + k < rows; ++k) {
          if (p.element_bytes == 4)
            static_cast<unsigned int*>(p.mask)[e + k] = tile[jj][r + k];
          else
            static_cast<unsigned short*>(p.mask)[e + k] = static_cast<unsigned short>(tile[jj][r + k]);
        }
      }
      __syncthreads();
    }
  }
}
)";

struct Params {
  void* mask;
  unsigned long long seed, offset;
  const void* seed_at;
  const void* offset_at;
  long long heads, seq_q, seq_kv, batch_offset, head_offset, global_heads, numel;
  unsigned int keep_from;
  unsigned int kept;
  int element_bytes;
  int causal;
  int vector_stores;
};

float keepScale(double dropout_p) { return static_cast<float>(dropoutKeepScale(dropout_p)); }

// The smallest Philox word that is kept. The CPU keeps an element where float(u) >= float(p), u =
// (word >> 8) * 2^-24 (exact in a float); for a float t that is (word >> 8) >= ceil(t * 2^24) (t * 2^24
// is exact in a double), i.e. word >= ceil(t * 2^24) << 8: one integer compare per element on the
// GPU in place of a conversion and a float compare. The bound reaches 2^32 only where float(p) rounds
// to 1, when nothing is kept: dropoutMask then gives kept elements the bits of 0.
uint64_t keepFrom(double dropout_p) {
  const double t = static_cast<double>(static_cast<float>(dropout_p));
  return static_cast<uint64_t>(std::max(0.0, std::ceil(std::ldexp(t, 24)))) << 8;
}

uint32_t keptBits(DataType dtype, float value) {
  if (dtype == DataType::Float) return std::bit_cast<uint32_t>(value);
  return dtype == DataType::BFloat16 ? floatToBf16(value) : floatToHalf(value);
}

}  // namespace

std::string dropoutMaskSource() { return kernelPrelude() + philoxSource() + kKernel; }

namespace {
// The keep scale as a mask of `dtype` holds it.
float heldScale(double dropout_p, DataType dtype) {
  const float scale = keepScale(dropout_p);
  if (dtype == DataType::Float) return scale;
  const auto bits = static_cast<uint16_t>(keptBits(dtype, scale));
  return dtype == DataType::BFloat16 ? bf16ToFloat(bits) : halfToFloat(bits);
}
}  // namespace

MaskWidth maskWidthFromEnvironment() {
  const char* e = std::getenv("MESHFUSE_ATTENTION_MASK");
  const std::string v = e == nullptr ? "" : e;
  if (v.empty() || v == "narrow") return MaskWidth::Narrow;
  if (v == "exact") return MaskWidth::Exact;
  if (v == "byte")  // withdrawn in session 15: dropout_mask.h says why
    throw UserError(
        "MESHFUSE_ATTENTION_MASK=byte was withdrawn: cuDNN 9.19's attention backward applies a one-byte "
        "dropout mask as if every element were dropped; use narrow (the default) or exact");
  throw UserError("MESHFUSE_ATTENTION_MASK=" + v + " is not one of narrow, exact");
}

DataType dropoutMaskDataType(double dropout_p, DataType io) {
  // Read at each call (a getenv beside a cuDNN graph), so that a test can run every width in one process.
  return dropoutMaskDataType(dropout_p, io, maskWidthFromEnvironment());
}

DataType dropoutMaskDataType(double dropout_p, DataType io, MaskWidth width) {
  if (width == MaskWidth::Narrow) return io;
  return heldScale(dropout_p, io) == keepScale(dropout_p) ? io : DataType::Float;
}

float dropoutScaleCorrection(double dropout_p, DataType mask_dtype) {
  return keepScale(dropout_p) / heldScale(dropout_p, mask_dtype);
}

MaskOrder backwardMaskOrderFromEnvironment() {
  const char* e = std::getenv("MESHFUSE_ATTENTION_BACKWARD_MASK");
  const std::string v = e == nullptr ? "" : e;
  if (v.empty() || v == "query_major") return MaskOrder::QueryMajor;
  if (v == "key_major") return MaskOrder::KeyMajor;
  throw UserError("MESHFUSE_ATTENTION_BACKWARD_MASK=" + v + " is not one of key_major, query_major");
}

Tensor dropoutMask(int device, const AttentionParams& p, DataType dtype, const void* seed_at, const void* offset_at,
                   MaskOrder order) {
  const bool key_major = order == MaskOrder::KeyMajor;
  const uint64_t keep_from = keepFrom(p.dropout_p);
  Tensor mask =
      key_major
          ? Tensor::empty({p.batch, p.heads, p.seq_kv, p.seq_q}, dtype, Device::cuda(device)).permute({0, 1, 3, 2})
          : Tensor::empty({p.batch, p.heads, p.seq_q, p.seq_kv}, dtype, Device::cuda(device));
  Params params{mask.data(),
                p.seed,
                p.offset,
                seed_at,
                offset_at,
                p.heads,
                p.seq_q,
                p.seq_kv,
                p.batch_offset,
                p.head_offset,
                p.global_heads,
                mask.numel(),
                static_cast<uint32_t>(std::min<uint64_t>(keep_from, UINT32_MAX)),
                keep_from > UINT32_MAX ? 0u : keptBits(dtype, keepScale(p.dropout_p)),
                static_cast<int>(dataTypeSize(dtype)),
                p.causal ? 1 : 0,
                reinterpret_cast<uintptr_t>(mask.data()) % 16 == 0 ? 1 : 0};
  if (params.numel == 0) return mask;
  if (key_major) {
    KernelFunction kernel = cachedKernel(
        device, "meshfuse_dropout_mask_key_major", [] { return dropoutMaskSource(); },
        "meshfuse_dropout_mask_key_major");
    // A block per [64, 64] tile of a (batch, head) pair, the pairs on the grid's y.
    constexpr int64_t kTile = 64;
    const int64_t tiles = (p.seq_q + kTile - 1) / kTile * ((p.seq_kv + kTile - 1) / kTile);
    launchKernel(kernel, static_cast<unsigned>(std::min<int64_t>(tiles, int64_t{1} << 30)), 256, currentStream(device),
                 &params, 0, static_cast<unsigned>(std::min<int64_t>(p.batch * p.heads, 65535)));
    return mask;
  }
  KernelFunction kernel = cachedKernel(
      device, "meshfuse_dropout_mask", [] { return dropoutMaskSource(); }, "meshfuse_dropout_mask");
  // About 16 blocks a multiprocessor: every (batch, head) pair on the grid's y (up to its limit),
  // the query rows of a pair spread over x.
  const int64_t pairs = p.batch * p.heads, target = int64_t{multiprocessorCount(device)} * 16;
  const int64_t grid_y = std::min<int64_t>(pairs, 65535);
  const int64_t grid_x = std::min<int64_t>(p.seq_q, std::max<int64_t>(1, (target + grid_y - 1) / grid_y));
  launchKernel(kernel, static_cast<unsigned>(grid_x), 256, currentStream(device), &params, 0,
               static_cast<unsigned>(grid_y));
  return mask;
}

std::pair<Tensor, Tensor> devicePhiloxScalars(int device, int64_t seed, int64_t offset) {
  return cudnnPhiloxWords(device, nullptr, nullptr, static_cast<uint64_t>(seed), static_cast<uint64_t>(offset), 0);
}

}  // namespace meshfuse::cuda

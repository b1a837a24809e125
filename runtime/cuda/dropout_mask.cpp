#include "runtime/cuda/dropout_mask.h"

#include <bit>

#include "runtime/cuda/kernel_cache.h"
#include "runtime/cuda/pointwise_codegen.h"
#include "runtime/cuda/streams.h"
#include "runtime/half.h"

namespace meshfuse::cuda {

namespace {

// The kernel around pointwise_codegen's Philox (the one source of the CUDA rounds, kept in step with
// runtime/philox.h): u is the element's 24-bit uniform, as uniform() draws it.
const char* const kKernel = R"(
struct Params {
  void* mask;
  unsigned long long seed, offset;
  const unsigned long long* seed_at;    // when set, the seed and offset are read from device memory
  const unsigned long long* offset_at;  // (the forward's 0-dim outputs), with no host round trip
  long long heads, seq_q, seq_kv, batch_offset, head_offset, global_heads, numel;
  float threshold;
  unsigned int kept;   // the bits a kept element gets (of a 2- or 4-byte element)
  int element_bytes;
  int causal;          // top-left causal: (i, j) with j > i is masked out
};
extern "C" __global__ void meshfuse_dropout_mask(Params p) {
  if (p.seed_at != nullptr) {
    p.seed = *p.seed_at;
    p.offset = *p.offset_at;
  }
  // A block per row (b, h, i): the row's indices are divided out once, not per element (64-bit
  // division is a long instruction sequence), and under a causal mask the elements past the
  // diagonal, which cuDNN multiplies by a probability of 0, get 0 without their Philox draw.
  const long long rows = p.numel / p.seq_kv;
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long i = row % p.seq_q, bh = row / p.seq_q;
    const long long h = bh % p.heads, b = bh / p.heads;
    const unsigned long long base =
        ((unsigned long long)(b + p.batch_offset) * p.global_heads + (h + p.head_offset)) * p.seq_q * p.seq_kv +
        (unsigned long long)i * p.seq_kv;
    const long long computed = p.causal ? min(p.seq_kv, i + 1) : p.seq_kv;
    for (long long j = threadIdx.x; j < p.seq_kv; j += blockDim.x) {
      unsigned int bits = 0u;
      if (j < computed && philoxUnitF(philox4x32(base + j, p.offset, p.seed).x) >= p.threshold) bits = p.kept;
      const long long e = row * p.seq_kv + j;
      if (p.element_bytes == 4)
        ((unsigned int*)p.mask)[e] = bits;
      else
        ((unsigned short*)p.mask)[e] = (unsigned short)bits;
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
  float threshold;
  unsigned int kept;
  int element_bytes;
  int causal;
};

float keepScale(double dropout_p) { return static_cast<float>(dropoutKeepScale(dropout_p)); }

uint32_t keptBits(DataType dtype, float value) {
  if (dtype == DataType::Float) return std::bit_cast<uint32_t>(value);
  return dtype == DataType::BFloat16 ? floatToBf16(value) : floatToHalf(value);
}

}  // namespace

std::string dropoutMaskSource() { return kernelPrelude() + philoxSource() + kKernel; }

DataType dropoutMaskDataType(double dropout_p, DataType io) {
  const float scale = keepScale(dropout_p);
  const uint32_t bits = keptBits(io, scale);
  const float held =
      io == DataType::BFloat16 ? bf16ToFloat(static_cast<uint16_t>(bits)) : halfToFloat(static_cast<uint16_t>(bits));
  return held == scale ? io : DataType::Float;
}

Tensor dropoutMask(int device, const AttentionParams& p, DataType dtype, const void* seed_at, const void* offset_at) {
  Tensor mask = Tensor::empty({p.batch, p.heads, p.seq_q, p.seq_kv}, dtype, Device::cuda(device));
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
                static_cast<float>(p.dropout_p),
                keptBits(dtype, keepScale(p.dropout_p)),
                static_cast<int>(dataTypeSize(dtype)),
                p.causal ? 1 : 0};
  if (params.numel == 0) return mask;
  KernelFunction kernel = cachedKernel(
      device, "meshfuse_dropout_mask", [] { return dropoutMaskSource(); }, "meshfuse_dropout_mask");
  const int64_t blocks = std::min<int64_t>(params.numel / p.seq_kv, int64_t{multiprocessorCount(device)} * 16);
  launchKernel(kernel, static_cast<unsigned>(blocks), 256, currentStream(device), &params);
  return mask;
}

namespace {
const char* const kStoreKernel = R"(
struct StoreParams {
  long long* out;
  long long value;
};
extern "C" __global__ void meshfuse_store_int64(StoreParams p) { *p.out = p.value; }
)";

struct StoreParams {
  void* out;
  long long value;
};
}  // namespace

std::string storeInt64Source() { return kStoreKernel; }

Tensor deviceInt64Scalar(int device, int64_t value) {
  Tensor t = Tensor::empty({}, DataType::Int, Device::cuda(device));
  StoreParams params{t.data(), static_cast<long long>(value)};
  KernelFunction kernel = cachedKernel(
      device, "meshfuse_store_int64", [] { return storeInt64Source(); }, "meshfuse_store_int64");
  launchKernel(kernel, 1, 1, currentStream(device), &params);
  return t;
}

}  // namespace meshfuse::cuda

#include "runtime/cuda/dropout_mask.h"

#include "runtime/cuda/kernel_cache.h"
#include "runtime/cuda/streams.h"

namespace meshfuse::cuda {

namespace {

// The same rounds as philox::generate (runtime/philox.h); keep the two in step (a GPU test
// compares CPU and CUDA dropout).
const char* const kSource = R"(
struct Params {
  unsigned short* mask;
  unsigned long long seed, offset;
  long long heads, seq_q, seq_kv, batch_offset, head_offset, global_heads, numel;
  float threshold;
  unsigned short one;
};
extern "C" __global__ void meshfuse_dropout_mask(Params p) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < p.numel; e += stride) {
    const long long j = e % p.seq_kv, rest = e / p.seq_kv;
    const long long i = rest % p.seq_q, bh = rest / p.seq_q;
    const long long h = bh % p.heads, b = bh / p.heads;
    const unsigned long long g =
        ((unsigned long long)(b + p.batch_offset) * p.global_heads + (h + p.head_offset)) * p.seq_q * p.seq_kv +
        (unsigned long long)i * p.seq_kv + j;
    unsigned c0 = (unsigned)g, c1 = (unsigned)(g >> 32), c2 = (unsigned)p.offset, c3 = (unsigned)(p.offset >> 32);
    unsigned k0 = (unsigned)p.seed, k1 = (unsigned)(p.seed >> 32);
    for (int r = 0; r < 10; ++r) {
      const unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
      const unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
      const unsigned n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
      c1 = lo1;
      c3 = lo0;
      c0 = n0;
      c2 = n2;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const float u = (float)(c0 >> 8) * 5.9604644775390625e-08f;  // 2^-24
    p.mask[e] = u >= p.threshold ? p.one : (unsigned short)0;
  }
}
)";

struct Params {
  void* mask;
  unsigned long long seed, offset;
  long long heads, seq_q, seq_kv, batch_offset, head_offset, global_heads, numel;
  float threshold;
  unsigned short one;
};

}  // namespace

Tensor dropoutMask(int device, const AttentionParams& p, DataType dtype) {
  Tensor mask = Tensor::empty({p.batch, p.heads, p.seq_q, p.seq_kv}, dtype, Device::cuda(device));
  Params params{mask.data(),
                p.seed,
                p.offset,
                p.heads,
                p.seq_q,
                p.seq_kv,
                p.batch_offset,
                p.head_offset,
                p.global_heads,
                mask.numel(),
                static_cast<float>(p.dropout_p),
                static_cast<unsigned short>(dtype == DataType::BFloat16 ? 0x3F80 : 0x3C00)};  // 1.0
  if (params.numel == 0) return mask;
  KernelFunction kernel = cachedKernel(
      device, "meshfuse_dropout_mask", [] { return std::string(kSource); }, "meshfuse_dropout_mask");
  const int64_t blocks = std::min<int64_t>((params.numel + 255) / 256, int64_t{multiprocessorCount(device)} * 8);
  launchKernel(kernel, static_cast<unsigned>(blocks), 256, currentStream(device), &params);
  return mask;
}

}  // namespace meshfuse::cuda

#include "runtime/cuda/attention_rng.h"

#include <cstdlib>
#include <string>

#include "ir/ir.h"
#include "runtime/cuda/kernel_cache.h"
#include "runtime/cuda/streams.h"

namespace meshfuse::cuda {

AttentionRng attentionRngFromEnvironment() {
  const char* e = std::getenv("MESHFUSE_ATTENTION_RNG");
  const std::string v = e == nullptr ? "" : e;
  if (v.empty() || v == "cudnn") return AttentionRng::Cudnn;
  if (v == "meshfuse") return AttentionRng::Meshfuse;
  throw UserError("MESHFUSE_ATTENTION_RNG=" + v +
                  " is not one of cudnn (the default: cuDNN's in-kernel dropout, a mask the CPU cannot draw) and "
                  "meshfuse (meshfuse's Philox mask: CPU and CUDA drop the same elements, slower on CUDA)");
}

uint64_t cudnnShardKey(const AttentionParams& p) {
  if (!p.sharded) return 0;
  return static_cast<uint64_t>(p.batch_offset) * static_cast<uint64_t>(p.global_heads) +
         static_cast<uint64_t>(p.head_offset);
}

namespace {
// mixShardSeed (attention_rng.h) in CUDA C: the unit test runs both on the same keys.
const char* const kPhiloxWordsKernel = R"(
struct PhiloxWordsParams {
  long long* out;
  const long long* seed_at;
  const long long* offset_at;
  unsigned long long seed, offset, key;
};
extern "C" __global__ void meshfuse_philox_words(PhiloxWordsParams p) {
  unsigned long long seed = p.seed_at ? (unsigned long long)p.seed_at[0] : p.seed;
  unsigned long long z = seed;
  if (p.key != 0) {
    z = seed + p.key * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z = z ^ (z >> 31);
  }
  p.out[0] = (long long)z;
  p.out[2] = p.offset_at ? p.offset_at[0] : (long long)p.offset;
}
)";

struct PhiloxWordsParams {
  void* out;
  const void* seed_at;
  const void* offset_at;
  uint64_t seed, offset, key;
};
}  // namespace

std::string philoxWordsSource() { return kPhiloxWordsKernel; }

std::pair<Tensor, Tensor> cudnnPhiloxWords(int device, const void* seed_at, const void* offset_at, uint64_t seed,
                                           uint64_t offset, uint64_t key) {
  // Four words, the offset at word 2: each view starts 16-byte aligned, as cuDNN's in-kernel dropout
  // reads them.
  const Tensor both = Tensor::empty({4}, DataType::Int, Device::cuda(device));
  PhiloxWordsParams params{both.data(), seed_at, offset_at, seed, offset, key};
  KernelFunction kernel = cachedKernel(
      device, "meshfuse_philox_words", [] { return philoxWordsSource(); }, "meshfuse_philox_words");
  launchKernel(kernel, 1, 1, currentStream(device), &params);
  return {both.slice(0, 0, 1).view({}), both.slice(0, 2, 1).view({})};
}

}  // namespace meshfuse::cuda

// Built with -ffp-contract=off (CMakeLists.txt): uniformFloats must round the product before the
// sum, or the AVX2/AVX-512 clones would fuse them and differ from the CUDA kernels in the last bit.
#include "runtime/cpu/philox_block.h"

#include "runtime/cpu/simd_clones.h"
#include "runtime/philox.h"

namespace meshfuse::cpu {

MESHFUSE_SIMD_CLONES void philoxWords(const uint64_t* __restrict index, int64_t n, uint64_t offset, uint64_t seed,
                                      uint32_t* __restrict w0, uint32_t* __restrict w1, uint32_t* __restrict w2,
                                      uint32_t* __restrict w3) {
  // The rounds of philox::generate, written out so that the loop over i vectorizes.
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  const auto offset_lo = static_cast<uint32_t>(offset), offset_hi = static_cast<uint32_t>(offset >> 32);
  const auto seed_lo = static_cast<uint32_t>(seed), seed_hi = static_cast<uint32_t>(seed >> 32);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t c0 = static_cast<uint32_t>(index[i]), c1 = static_cast<uint32_t>(index[i] >> 32);
    uint32_t c2 = offset_lo, c3 = offset_hi, k0 = seed_lo, k1 = seed_hi;
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
      const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
      c1 = static_cast<uint32_t>(p1);
      c3 = static_cast<uint32_t>(p0);
      c0 = n0;
      c2 = n2;
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    w0[i] = c0;
    w1[i] = c1;
    w2[i] = c2;
    w3[i] = c3;
  }
}

MESHFUSE_SIMD_CLONES void uniformFloats(const uint32_t* __restrict w, int64_t n, float lo, float hi,
                                        float* __restrict out) {
  const float span = hi - lo;
  for (int64_t i = 0; i < n; ++i) out[i] = lo + span * philox::unitFloat(w[i]);
}

}  // namespace meshfuse::cpu

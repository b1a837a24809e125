// Built with -ffp-contract=off (CMakeLists.txt): uniformFloats must round the product before the
// sum, or the AVX2/AVX-512 clones would fuse them and differ from the CUDA kernels in the last bit.
#include "runtime/cpu/philox_block.h"

#include "runtime/cpu/simd_clones.h"
#include "runtime/philox.h"

namespace meshfuse::cpu {

MESHFUSE_SIMD_CLONES void philoxWords(const uint64_t* __restrict index, int64_t n, uint64_t offset, uint64_t seed,
                                      uint32_t* __restrict w0, uint32_t* __restrict w1, uint32_t* __restrict w2,
                                      uint32_t* __restrict w3) {
  // philox::generate's rounds over every counter of the block: this loop over i vectorizes.
  const auto offset_lo = static_cast<uint32_t>(offset), offset_hi = static_cast<uint32_t>(offset >> 32);
  const auto seed_lo = static_cast<uint32_t>(seed), seed_hi = static_cast<uint32_t>(seed >> 32);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t c0 = static_cast<uint32_t>(index[i]), c1 = static_cast<uint32_t>(index[i] >> 32);
    uint32_t c2 = offset_lo, c3 = offset_hi, k0 = seed_lo, k1 = seed_hi;
    for (int r = 0; r < 10; ++r) philox::oneRound(c0, c1, c2, c3, k0, k1);
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

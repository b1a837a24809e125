// Philox 4x32-10 (runtime/philox.h) for a block of counters at once. The random ops and attention
// dropout draw one counter per element, thousands per tile; one counter at a time the ten rounds
// run in scalar registers, while a block of them vectorizes (built for AVX-512, AVX2 and the
// baseline, simd_clones.h). Same bits as philox::generate: tests/cpp/test_cpu_philox.cpp checks.
#pragma once
#include <cstdint>
#include <vector>

namespace meshfuse::cpu {

// Words 0..3 of philox::generate(index[i], offset, seed) for i < n, into w0..w3[i].
void philoxWords(const uint64_t* index, int64_t n, uint64_t offset, uint64_t seed, uint32_t* w0, uint32_t* w1,
                 uint32_t* w2, uint32_t* w3);

// The builds philoxWords chooses from (AVX-512 intrinsics, the portable loop) that this CPU runs,
// so that tests check each of them, not only the one this machine would pick.
using PhiloxWordsFn = void (*)(const uint64_t*, int64_t, uint64_t, uint64_t, uint32_t*, uint32_t*, uint32_t*,
                               uint32_t*);
struct PhiloxBuild {
  const char* name;
  PhiloxWordsFn words;
};
std::vector<PhiloxBuild> philoxBuilds();

// out[i] = lo + (hi - lo) * philox::unitFloat(w[i]), in float and rounded step by step (no fused
// multiply-add), as philox::uniformFrom and the CUDA kernels compute it.
void uniformFloats(const uint32_t* w, int64_t n, float lo, float hi, float* out);

}  // namespace meshfuse::cpu

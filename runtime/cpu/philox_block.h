// Philox 4x32-10 (runtime/philox.h) for a block of counters at once. A counter serves up to four
// elements of a draw (a Float uniform, the attention mask), thousands a tile; one counter at a time
// the ten rounds run in scalar registers, while a block of them vectorizes (built for AVX-512, AVX2
// and the baseline, simd_clones.h). Same bits as philox::generate: tests/cpp/test_cpu_philox.cpp
// checks.
#pragma once
#include <cstdint>
#include <vector>

namespace meshfuse::cpu {

// The four words of philox::generate(counter[i], offset, seed) for i < n, into out[4 * i .. 4 * i + 3]:
// for consecutive counters c0, c0 + 1, ... out is the stream's words from 4 * c0 on, so element
// g's words are out[g * W - 4 * c0 ...] (W = philox::wordsPerElement), read in place.
void philoxWords(const uint64_t* counter, int64_t n, uint64_t offset, uint64_t seed, uint32_t* out);

// The counters first .. first + n - 1 into `counter` (what philoxWords reads for a run of a draw).
inline void consecutiveCounters(uint64_t first, int64_t n, uint64_t* counter) {
  for (int64_t i = 0; i < n; ++i) counter[i] = first + static_cast<uint64_t>(i);
}

// The builds philoxWords chooses from (AVX-512 intrinsics, the portable loop) that this CPU runs,
// so that tests check each of them, not only the one this machine would pick.
using PhiloxWordsFn = void (*)(const uint64_t*, int64_t, uint64_t, uint64_t, uint32_t*);
struct PhiloxBuild {
  const char* name;
  PhiloxWordsFn words;
};
std::vector<PhiloxBuild> philoxBuilds();

// out[i] = lo + (hi - lo) * philox::unitFloat(w[i]), in float and rounded step by step (no fused
// multiply-add), as philox::uniformFrom and the CUDA kernels compute it.
void uniformFloats(const uint32_t* w, int64_t n, float lo, float hi, float* out);

}  // namespace meshfuse::cpu

// Which kernels OpenBLAS runs. A DYNAMIC_ARCH OpenBLAS (Debian's) picks its kernel family from the
// CPU model when it loads, and falls back to Prescott (SSE3) for a model it does not know: 0.3.21
// does not know Sapphire/Emerald Rapids, and its sgemm then runs at a quarter of the AVX-512
// kernels' rate. OPENBLAS_CORETYPE chooses by hand, but only before OpenBLAS loads, and nothing
// warned a user who had not set it. So when libmeshfuse loads (after its OpenBLAS), a fallback
// core on a CPU with AVX2 and FMA is replaced by the family the CPU runs (SkylakeX for AVX-512,
// else Haswell), through OpenBLAS's own dynamic-arch initializer. An OPENBLAS_CORETYPE the user
// set is kept, as is any core OpenBLAS recognized. MESHFUSE_DEBUG=INFO says what happened.
#pragma once
#include <string>

namespace meshfuse::cpu {

struct BlasCore {
  std::string detected;  // OpenBLAS's core when libmeshfuse loaded ("" without OpenBLAS's corename)
  std::string active;    // its core now
  bool switched = false;
  std::string reason;  // why it was or was not switched
};

// What happened when libmeshfuse loaded (decided once, at load).
const BlasCore& blasCore();

// The OpenBLAS core family for this CPU's vector units: "SkylakeX" (AVX-512 F/CD/BW/DQ/VL),
// "Haswell" (AVX2 and FMA), else "".
std::string blasCoreForCpu();

// True for the cores OpenBLAS falls back to on an unknown CPU (no AVX2 kernels).
bool isFallbackBlasCore(const std::string& core);

// Re-runs OpenBLAS's dynamic-arch initializer with OPENBLAS_CORETYPE = `core` (the environment is
// restored afterwards); returns false when this OpenBLAS has no such initializer (not a
// DYNAMIC_ARCH build). No BLAS call may be in flight. OpenBLAS's core afterwards is `core` when it
// knows the name, else its own fallback.
bool switchBlasCore(const std::string& core);

// openblas_get_corename(), or "" when this BLAS has none.
std::string blasCoreName();

}  // namespace meshfuse::cpu

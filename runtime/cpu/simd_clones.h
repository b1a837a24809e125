// MESHFUSE_SIMD_CLONES: compile a hot CPU loop three times, for AVX-512 (x86-64-v4), AVX2 + FMA
// (x86-64-v3) and the x86-64 baseline, and let the dynamic loader pick the widest one this CPU
// runs (GCC function multiversioning, an IFUNC). The library as a whole stays built for the
// baseline, so it loads on any x86-64 machine; only the marked loops use the wider registers.
//
// Mark functions whose body is the loop (templates included). Functions they call are inlined
// into each clone; out-of-line callees run the baseline code, so no wide instruction leaks into
// code shared with the rest of the library. Elsewhere (other compilers, other architectures,
// MESHFUSE_NO_SIMD_CLONES defined) the macro is empty and the loop is built once.
//
// MESHFUSE_X86_TARGETS is defined where the clones are built: there a loop that GCC does not
// vectorize well may also be written with intrinsics in functions marked MESHFUSE_TARGET_V4 or
// MESHFUSE_TARGET_V3, and picked at run time with __builtin_cpu_supports (half_runs.cpp).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MESHFUSE_NO_SIMD_CLONES)
#define MESHFUSE_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define MESHFUSE_X86_TARGETS 1
#define MESHFUSE_TARGET_V4 __attribute__((target("arch=x86-64-v4")))
#define MESHFUSE_TARGET_V3 __attribute__((target("arch=x86-64-v3")))
#else
#define MESHFUSE_SIMD_CLONES
#endif

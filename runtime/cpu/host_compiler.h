// Compiles generated C++ (runtime/cpu/pointwise_codegen.h) into a shared object with the host's C++
// compiler and loads it, as torch.compile's CPU backend does. Objects are cached on disk by a hash of
// the source, the compiler, its flags and the CPU's model and flags (MESHFUSE_CACHE_DIR, else
// $XDG_CACHE_HOME/meshfuse, else ~/.cache/meshfuse), so a program compiles once per machine, not once
// per process or rank; ranks that compile the same program at once each write their own file and
// rename it into place.
//
// MESHFUSE_CPU_CODEGEN picks when it is used: "auto" (the default) for programs large enough that a
// compile (about 0.3 s, once) pays back, "always" for every program it can express (the tests), "off"
// for none. MESHFUSE_CXX (else CXX, else c++) names the compiler. Where it is missing or fails, the
// interpreter runs the program and meshfuse says so once on stderr.
#pragma once
#include <cstdint>
#include <string>

namespace meshfuse::cpu {

enum class CodegenMode { Off, Auto, Always };

// MESHFUSE_CPU_CODEGEN, read at each call (a test process switches it); an unknown value throws.
CodegenMode codegenModeFromEnvironment();

// Whether MESHFUSE_CPU_CODEGEN asks to compile a program of `work` element-ops per call (elements
// times steps). "auto" compiles from kCodegenMinWork: the transformer layer's [512, 1024] five-op
// pointwise chains and up. A compile takes about 0.3 s once per machine; small programs, most of
// the tests', stay interpreted.
inline constexpr int64_t kCodegenMinWork = int64_t{1} << 21;
bool codegenWanted(int64_t work);

using TileKernel = void (*)(const float* const* in, float* const* out, long n);

// The kernel `symbol` of `source`, compiled (or found in the caches), or nullptr where the compiler
// is missing or fails. Thread-safe; one compile per source and process.
TileKernel compiledTileKernel(const std::string& source, const char* symbol);

}  // namespace meshfuse::cpu

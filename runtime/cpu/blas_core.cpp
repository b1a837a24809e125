// OpenBLAS's core type, checked and corrected once when libmeshfuse loads (see blas_core.h).
#include "runtime/cpu/blas_core.h"

#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>
#include <optional>

#include "multidevice/debug_log.h"

namespace meshfuse::cpu {

namespace {

BlasCore decideAtLoad() {
  BlasCore r;
  r.detected = r.active = blasCoreName();
  if (const char* env = std::getenv("OPENBLAS_CORETYPE")) {
    r.reason = std::string("OPENBLAS_CORETYPE=") + env + " is set";
    return r;
  }
  if (!isFallbackBlasCore(r.detected)) {
    r.reason = "OpenBLAS recognized this CPU";
    return r;
  }
  const std::string want = blasCoreForCpu();
  if (want.empty()) {
    r.reason = "the CPU has no AVX2 and FMA";
    return r;
  }
  if (!switchBlasCore(want)) {
    r.reason = "this OpenBLAS has no dynamic-arch initializer (not a DYNAMIC_ARCH build)";
    return r;
  }
  r.active = blasCoreName();
  r.switched = r.active != r.detected;
  r.reason = r.active == want ? "OpenBLAS fell back to " + r.detected + " on a CPU that runs " + want + " kernels"
                              : "OpenBLAS does not know the core " + want;
  return r;
}

// Decided when libmeshfuse loads, before any meshfuse code (or user code after the load) calls BLAS.
[[maybe_unused]] const BlasCore& g_at_load = blasCore();

// A symbol of the OpenBLAS that libmeshfuse links (found from openblas_get_corename's library, so
// also when libmeshfuse was loaded RTLD_LOCAL), or nullptr.
void* openblasSymbol(const char* name) {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&openblas_get_corename), &info) == 0 || info.dli_fname == nullptr) return nullptr;
  void* lib = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  void* sym = dlsym(lib, name);
  dlclose(lib);  // drops the reference RTLD_NOLOAD took; the library stays loaded
  return sym;
}

}  // namespace

std::string blasCoreName() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

bool isFallbackBlasCore(const std::string& core) {
  // dynamic.c's fallbacks for an unknown model (Prescott; Nehalem in some versions), and the older
  // families that would also leave an AVX2 CPU on SSE kernels.
  for (const char* old : {"Prescott", "Nehalem", "Core2", "Penryn", "Dunnington", "Atom", "Nano", "Katmai",
                          "Coppermine", "Northwood", "Banias"})
    if (core == old) return true;
  return false;
}

std::string blasCoreForCpu() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return "";
}

bool switchBlasCore(const std::string& core) {
  using Fn = void (*)();
  auto quit = reinterpret_cast<Fn>(openblasSymbol("gotoblas_dynamic_quit"));
  auto init = reinterpret_cast<Fn>(openblasSymbol("gotoblas_dynamic_init"));
  if (!quit || !init) return false;
  std::optional<std::string> saved;
  if (const char* env = std::getenv("OPENBLAS_CORETYPE")) saved = env;
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  quit();  // forgets the kernel table; init reads OPENBLAS_CORETYPE and installs the named family's
  init();
  if (saved)
    setenv("OPENBLAS_CORETYPE", saved->c_str(), 1);
  else
    unsetenv("OPENBLAS_CORETYPE");
  return true;
}

const BlasCore& blasCore() {
  static const BlasCore core = [] {
    BlasCore r = decideAtLoad();
    if (debug::enabled(debug::Level::Info))
      debug::info("OpenBLAS core " + r.active + (r.switched ? " (was " + r.detected + ")" : "") + ": " + r.reason);
    return r;
  }();
  return core;
}

}  // namespace meshfuse::cpu

#include "runtime/cpu/host_compiler.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

extern char** environ;  // NOLINT(readability-redundant-declaration): POSIX declares it in no header

namespace meshfuse::cpu {

namespace {

namespace fs = std::filesystem;

// -march=native: the machine that compiles is the one that runs. -fno-trapping-math lets the selects
// vectorize, as for the library's own kernels (CMakeLists.txt); -fno-math-errno makes sqrt an
// instruction. No -ffast-math: NaN, inf and the order of operations stay as the interpreter's.
const std::vector<std::string> kFlags = {
    "-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fopenmp-simd", "-std=c++17", "-fPIC", "-shared",
    "-w"};

std::string compilerName() {
  for (const char* var : {"MESHFUSE_CXX", "CXX"})
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return v;
  return "c++";
}

uint64_t fnv1a(const std::string& s, uint64_t h = 0xcbf29ce484222325ULL) {
  for (const unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ULL;
  return h;
}

fs::path cacheDirectory() {
  if (const char* v = std::getenv("MESHFUSE_CACHE_DIR"); v != nullptr && *v != '\0') return fs::path(v) / "cpu-kernels";
  if (const char* v = std::getenv("XDG_CACHE_HOME"); v != nullptr && *v != '\0')
    return fs::path(v) / "meshfuse" / "cpu-kernels";
  if (const char* v = std::getenv("HOME"); v != nullptr && *v != '\0')
    return fs::path(v) / ".cache" / "meshfuse" / "cpu-kernels";
  return fs::temp_directory_path() / "meshfuse-cpu-kernels";
}

// Why a kernel could not be had: `why` is empty on success. A compiler that cannot be started stays
// missing for the process (no retry per program); a compile that fails is that program's alone.
struct Failure {
  std::string why;
  bool compiler_missing = false;
  bool failed() const { return !why.empty(); }
};

// Runs the compiler on `source` into `object`, its output into `log`.
// posix_spawn (a vfork), not fork: an MPI process may have memory registered with its transports.
Failure runCompiler(const std::string& compiler, const fs::path& source, const fs::path& object, const fs::path& log) {
  std::vector<std::string> args = {compiler};
  args.insert(args.end(), kFlags.begin(), kFlags.end());
  args.insert(args.end(), {"-o", object.string(), source.string()});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, compiler.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return {"cannot run " + compiler + ": " + std::generic_category().message(err), true};
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return {"waitpid failed"};
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  std::ifstream in(log);
  std::string first_line;
  std::getline(in, first_line);
  return {compiler + " failed (" + log.string() + "): " + first_line};
}

void warnOnce(const std::string& why) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::fprintf(stderr,
                 "meshfuse: CPU codegen unavailable (%s); pointwise programs run interpreted "
                 "(MESHFUSE_CPU_CODEGEN=off silences this)\n",
                 why.c_str());
  });
}

// The CPU's model and feature flags (Linux's /proc/cpuinfo): an object built with -march=native for
// one CPU may not run on another (SIGILL), and a cache under a shared home directory sees many.
const std::string& cpuSignature() {
  static const std::string signature = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line, found;
    while (std::getline(in, line)) {
      if (line.rfind("model name", 0) == 0 || line.rfind("flags", 0) == 0) found += line + "\n";
      if (line.empty() && !found.empty()) break;  // the first processor's block is enough
    }
    return found;
  }();
  return signature;
}

// Finds the object in the disk cache or compiles it there into `object`. The key names what the
// object is built from: compiler, flags, the CPU that -march=native targets, source.
Failure objectFor(const std::string& source, fs::path& object) {
  const std::string compiler = compilerName();
  uint64_t h = fnv1a(cpuSignature(), fnv1a(compiler));
  for (const std::string& f : kFlags) h = fnv1a(f, h);
  h = fnv1a(source, h);
  char name[64];
  std::snprintf(name, sizeof name, "%016llx-%zu", static_cast<unsigned long long>(h), source.size());
  std::error_code ec;
  const fs::path dir = cacheDirectory();
  fs::create_directories(dir, ec);
  if (ec) return {"cannot create " + dir.string() + ": " + ec.message()};
  object = dir / (std::string(name) + ".so");
  if (fs::exists(object, ec)) return {};
  // Unique per process and thread: ranks compiling the same program each write their own file.
  const std::string mine = std::string(name) + "." + std::to_string(getpid()) + "." +
                           std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  const fs::path src = dir / (mine + ".cpp"), tmp = dir / (mine + ".so"), log = dir / (mine + ".log");
  {
    std::ofstream out(src);
    out << source;
    if (!out) return {"cannot write " + src.string()};
  }
  Failure failure = runCompiler(compiler, src, tmp, log);
  if (!failure.failed()) {
    fs::rename(tmp, object, ec);  // atomic: a reader sees no object or a whole one
    if (ec) failure.why = "cannot rename " + tmp.string() + ": " + ec.message();
  }
  fs::remove(src, ec);
  if (!failure.failed()) fs::remove(log, ec);
  fs::remove(tmp, ec);
  return failure;
}

}  // namespace

CodegenMode codegenModeFromEnvironment() {
  const char* v = std::getenv("MESHFUSE_CPU_CODEGEN");
  const std::string mode = v == nullptr ? "" : v;
  if (mode.empty() || mode == "auto") return CodegenMode::Auto;
  if (mode == "always") return CodegenMode::Always;
  if (mode == "off" || mode == "0") return CodegenMode::Off;
  throw std::invalid_argument("MESHFUSE_CPU_CODEGEN must be auto, always or off, got '" + mode + "'");
}

bool codegenWanted(int64_t work) {
  const CodegenMode mode = codegenModeFromEnvironment();
  return mode == CodegenMode::Always || (mode == CodegenMode::Auto && work >= kCodegenMinWork);
}

TileKernel compiledTileKernel(const std::string& source, const char* symbol) {
  static std::mutex mutex;
  static std::unordered_map<std::string, TileKernel> loaded;  // by source; nullptr: failed before
  static bool compiler_missing = false;
  const std::lock_guard<std::mutex> lock(mutex);
  if (compiler_missing) return nullptr;
  if (auto it = loaded.find(source); it != loaded.end()) return it->second;
  TileKernel& kernel = loaded[source];
  fs::path object;
  Failure failure = objectFor(source, object);
  if (!failure.failed()) {
    // Never closed: the kernel lives as long as the process may run the program.
    void* handle = dlopen(object.c_str(), RTLD_NOW | RTLD_LOCAL);
    void* fn = handle != nullptr ? dlsym(handle, symbol) : nullptr;
    if (fn == nullptr) {
      const char* err = dlerror();
      failure.why = "cannot load " + object.string() + ": " + (err != nullptr ? err : "no symbol");
    }
    kernel = reinterpret_cast<TileKernel>(fn);
  }
  if (failure.failed()) {
    compiler_missing = failure.compiler_missing;
    warnOnce(failure.why);
  }
  return kernel;
}

}  // namespace meshfuse::cpu

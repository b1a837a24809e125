// NVRTC compilation and the kernel cache (see kernel_cache.h).
#include "runtime/cuda/kernel_cache.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "runtime/host_span.h"

namespace meshfuse::cuda {

namespace {
std::atomic<int64_t> g_compilations{0};

struct Cache {
  std::mutex mutex;
  std::map<std::string, std::string> cubins;                      // key|arch -> cubin
  std::map<std::pair<int, std::string>, cudaKernel_t> functions;  // (device, key) -> loaded kernel
};
Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: modules live until the process ends
  return *c;
}
}  // namespace

std::string cudaIncludeDir() {
  static const std::string dir = [] {
    std::vector<std::string> roots;
    for (const char* var : {"CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"})
      if (const char* v = std::getenv(var); v && *v) roots.emplace_back(v);
    roots.emplace_back("/usr/local/cuda");
    std::string tried;
    for (const auto& root : roots) {
      for (const char* sub : {"/include", "/targets/x86_64-linux/include", "/targets/sbsa-linux/include"}) {
        std::string d = root + sub;
        if (std::filesystem::exists(d + "/cuda_fp16.h")) return d;
        tried += (tried.empty() ? "" : ", ") + d;
      }
    }
    throw std::runtime_error("NVRTC needs cuda_fp16.h from the CUDA toolkit; set CUDA_HOME (looked in " + tried + ")");
  }();
  return dir;
}

namespace {
// MESHFUSE_DUMP_KERNELS=<dir> writes each generated source and its cubin there (<n>-<name>.cu and
// .cubin), so that `cuobjdump --dump-resource-usage` or `nvdisasm` can show what NVRTC made of a
// kernel (registers, spills, the SASS of the hot loop) without a GPU.
void dumpKernel(const std::string& source, const std::string& cubin, const std::string& name, int64_t ordinal) {
  const char* dir = std::getenv("MESHFUSE_DUMP_KERNELS");  // per compilation (~0.1 s each): tests set it
  if (dir == nullptr || *dir == '\0') return;
  std::filesystem::create_directories(dir);
  const std::string stem = std::string(dir) + "/" + std::to_string(ordinal) + "-" + name;
  std::ofstream(stem + ".cu") << source;
  std::ofstream(stem + ".cubin", std::ios::binary) << cubin;
}
}  // namespace

std::string compileToCubin(const std::string& source, const std::string& program_name, const std::string& arch) {
  nvrtcProgram prog;
  MESHFUSE_NVRTC_CHECK(nvrtcCreateProgram(&prog, source.c_str(), (program_name + ".cu").c_str(), 0, nullptr, nullptr));
  const std::string arch_opt = "-arch=" + arch, include_opt = "-I" + cudaIncludeDir();
  // -lineinfo: line tables only (the code is unchanged), so compute-sanitizer and profilers name the
  // line of the generated source (MESHFUSE_DUMP_KERNELS writes it) instead of a bare offset.
  const char* options[] = {
      arch_opt.c_str(), include_opt.c_str(), "-std=c++17", "-default-device", "--extra-device-vectorization",
      "-lineinfo"};
  nvrtcResult result = nvrtcCompileProgram(prog, sizeof(options) / sizeof(options[0]), options);
  if (result != NVRTC_SUCCESS) {
    size_t log_size = 0;
    nvrtcGetProgramLogSize(prog, &log_size);
    std::string log(log_size, '\0');
    nvrtcGetProgramLog(prog, log.data());
    nvrtcDestroyProgram(&prog);
    throw std::runtime_error("NVRTC could not compile " + program_name + " for " + arch + ": " +
                             nvrtcGetErrorString(result) + "\n" + log + "\n--- source ---\n" + source);
  }
  size_t size = 0;
  MESHFUSE_NVRTC_CHECK(nvrtcGetCUBINSize(prog, &size));
  std::string cubin(size, '\0');
  MESHFUSE_NVRTC_CHECK(nvrtcGetCUBIN(prog, cubin.data()));
  nvrtcDestroyProgram(&prog);
  const int64_t ordinal = g_compilations++;
  dumpKernel(source, cubin, program_name, ordinal);
  return cubin;
}

std::string deviceArch(int device) {
  int major = 0, minor = 0;
  MESHFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MESHFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return "sm_" + std::to_string(major) + std::to_string(minor);
}

namespace {
// A device attribute, queried once per (attribute, device): launches read these on every execution.
int cachedAttribute(cudaDeviceAttr attribute, int device) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, int> values;
  std::lock_guard<std::mutex> lock(mutex);
  const std::pair<int, int> key{static_cast<int>(attribute), device};
  auto it = values.find(key);
  if (it != values.end()) return it->second;
  int value = 0;
  MESHFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  values[key] = value;
  return value;
}
}  // namespace

int multiprocessorCount(int device) { return cachedAttribute(cudaDevAttrMultiProcessorCount, device); }
int computeCapabilityMajor(int device) { return cachedAttribute(cudaDevAttrComputeCapabilityMajor, device); }

KernelFunction cachedKernel(int device, const std::string& key, const std::function<std::string()>& make_source,
                            const std::string& name) {
  host_span::Scope span("kernel cache lookup");
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto fit = c.functions.find({device, key});
  if (fit != c.functions.end()) return reinterpret_cast<KernelFunction>(fit->second);
  const std::string arch = deviceArch(device);
  auto& cubin = c.cubins[key + "|" + arch];
  if (cubin.empty()) cubin = compileToCubin(make_source(), name, arch);
  // A library is context-independent: its kernel is loaded into a device's context on first launch there.
  cudaLibrary_t library;
  MESHFUSE_CUDA_CHECK(cudaLibraryLoadData(&library, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  cudaKernel_t function;
  MESHFUSE_CUDA_CHECK(cudaLibraryGetKernel(&function, library, name.c_str()));
  c.functions[{device, key}] = function;
  return reinterpret_cast<KernelFunction>(function);
}

void launchKernel(KernelFunction kernel, unsigned grid, unsigned block, Stream stream, void* params,
                  unsigned dynamic_shared_bytes, unsigned grid_y, unsigned block_y) {
  host_span::Scope span("cudaLaunchKernel");
  void* args[] = {params};
  MESHFUSE_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(grid, grid_y), dim3(block, block_y),
                                       args, dynamic_shared_bytes, stream));
}

void launchClusterKernel(KernelFunction kernel, unsigned grid, unsigned block, unsigned block_y, unsigned cluster,
                         Stream stream, void* params) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(block, block_y);
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = cluster;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  host_span::Scope span("cudaLaunchKernelExC");
  void* args[] = {params};
  MESHFUSE_CUDA_CHECK(cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(kernel), args));
}

int64_t kernelCompilations() { return g_compilations.load(); }

}  // namespace meshfuse::cuda

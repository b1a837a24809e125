// Loading backend plugins: dlopen of libmeshfuse_<name>.so from the folder libmeshfuse itself was
// loaded from (the build tree, an install prefix, or a wheel's package folder).
#include "multidevice/backend_plugins.h"

#include <dlfcn.h>

#include <mutex>

namespace meshfuse {

namespace {

// The folder of the file this function was loaded from (libmeshfuse.so), with a trailing slash.
std::string libraryFolder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&libraryFolder), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

struct Plugin {
  std::once_flag once;
  std::string error;  // why it could not be loaded; "" once loaded
};

// Whether `type` is built as a plugin (libmeshfuse_<name>.so beside libmeshfuse).
bool isPluginBackend(CommunicatorBackend type) { return MESHFUSE_HAVE_UCC && type == CommunicatorBackend::Ucc; }

}  // namespace

std::string loadBackendPlugin(CommunicatorBackend type) {
  if (!isPluginBackend(type)) return "";
  static Plugin ucc;
  std::call_once(ucc.once, [] {
    const std::string path = libraryFolder() + "libmeshfuse_ucc.so";
    // RTLD_NOW: a missing symbol fails here, with the loader's message, not at a first collective.
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) {
      const char* why = dlerror();
      ucc.error = "its plugin " + path + " did not load: " + (why != nullptr ? why : "unknown error");
    }
  });
  return ucc.error;
}

void loadBackendPlugins() { loadBackendPlugin(CommunicatorBackend::Ucc); }

}  // namespace meshfuse

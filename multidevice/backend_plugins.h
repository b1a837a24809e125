// Backends built as plugins, loaded the first time they are asked for. The UCC backend is one:
// loading UCX (under UCC) installs its memory hooks, which took 0.4 s of every process's start on
// the 2-core development VM (binary patching with a grace period per hooked function), so a process
// that never asks for UCC (most: MPI, Gloo and NCCL users, and nearly every test binary) should
// not load it. The plugin registers its backend (registerBackend) from a static initializer.
#pragma once
#include <string>

#include "multidevice/communicator.h"

namespace meshfuse {

// Loads the plugin of `type` once (a no-op for backends built into libmeshfuse, and after the
// first call). Returns "" when it is loaded, else why not (the loader's message). Must not be
// called with the registry's lock held: the plugin's initializer registers its backend.
std::string loadBackendPlugin(CommunicatorBackend type);

// Loads every plugin this build has (for listing the available backends).
void loadBackendPlugins();

}  // namespace meshfuse

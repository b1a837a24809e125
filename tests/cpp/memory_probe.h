// Resident memory of this process (/proc/self/statm) and live CPU tensor bytes, for leak tests:
// run a loop long enough to settle, then check that neither grows over many more iterations.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>

#include "runtime/tensor.h"

namespace meshfuse::testing {

inline int64_t residentBytes() {
  long pages_total = 0, pages_resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  int got = std::fscanf(f, "%ld %ld", &pages_total, &pages_resident);
  std::fclose(f);
  return got == 2 ? static_cast<int64_t>(pages_resident) * sysconf(_SC_PAGESIZE) : -1;
}

// AddressSanitizer keeps freed memory in a quarantine (256 MB by default), so resident memory
// grows under it without any leak: leak tests check only live tensor bytes there.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kResidentMemoryIsMeaningful = false;
#else
constexpr bool kResidentMemoryIsMeaningful = true;
#endif

struct MemorySample {
  int64_t resident = residentBytes();
  int64_t cpu_tensor_bytes = cpuBytesInUse();
};

}  // namespace meshfuse::testing

// DLPack 1.0's versioned managed tensor, which Debian's dlpack v0.6 header lacks. Its layout is
// fixed by the DLPack ABI (dlpack.h 1.0, DLManagedTensorVersioned); the DLTensor inside is the same
// struct as in v0.6. Consumers that ask for max_version >= (1, 0) (numpy >= 2) get this one, which
// can say "writable" (numpy marks arrays from unversioned capsules read-only).
#pragma once
#include <dlpack/dlpack.h>

#include <cstdint>

namespace meshfuse::python {

struct DlpackVersion {
  uint32_t major;
  uint32_t minor;
};

struct DlpackManagedTensorVersioned {
  DlpackVersion version;
  void* manager_ctx;
  void (*deleter)(DlpackManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

constexpr uint64_t kDlpackFlagReadOnly = 1ull << 0;
constexpr uint32_t kDlpackMajorVersion = 1;

}  // namespace meshfuse::python

// Zero-copy exchange of tensors through DLPack: the unversioned v0.6 DLManagedTensor of Debian's
// libdlpack-dev (every producer offers it when asked without max_version) and the versioned 1.0
// one (python/dlpack_versioned.h), which consumers asking for max_version >= (1, 0) get.
#pragma once
#include <pybind11/pybind11.h>

#include "runtime/tensor.h"

namespace meshfuse::python {

// Imports a 'dltensor' or 'dltensor_versioned' capsule, or an object with __dlpack__ (called without
// a stream: the caller orders CUDA work first). The capsule is renamed 'used_dltensor[_versioned]'
// and the Tensor's storage calls the producer's deleter when the last view of it is released.
// Throws ValueError/TypeError for what meshfuse cannot hold (other dtypes, vector lanes, devices)
// without consuming the capsule. uint8_as_bool reads uint8 as Bool: producers that cannot export
// bool (numpy < 2, torch < 2) pass bool arrays as uint8 views of the same bytes.
Tensor tensorFromDlpack(const pybind11::object& obj, bool uint8_as_bool = false);

// Exports a Tensor as a 'dltensor' (or, versioned, 'dltensor_versioned') capsule that shares its
// storage; the managed tensor holds a reference to the storage until the consumer (or the capsule,
// if never consumed) deletes it. bool_as_uint8 labels Bool data uint8, for consumers that do not
// know DLPack's bool code.
pybind11::capsule tensorToDlpack(const Tensor& tensor, bool versioned, bool bool_as_uint8 = false);

// (device_type, device_id) as DLPack's __dlpack_device__ reports them.
pybind11::tuple dlpackDevice(const Tensor& tensor);

}  // namespace meshfuse::python

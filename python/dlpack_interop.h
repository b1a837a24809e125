// Zero-copy exchange of tensors through DLPack (the unversioned v0.6 DLManagedTensor that Debian's
// libdlpack-dev provides; every producer still offers it when asked without max_version).
#pragma once
#include <pybind11/pybind11.h>

#include "runtime/tensor.h"

namespace meshfuse::python {

// Imports a 'dltensor' capsule, or an object with __dlpack__ (called without a stream: the caller
// orders CUDA work first). The capsule is renamed 'used_dltensor' and the Tensor's storage calls the
// producer's deleter when the last view of it is released. Throws ValueError/TypeError for what
// meshfuse cannot hold (other dtypes, vector lanes, devices) without consuming the capsule.
Tensor tensorFromDlpack(const pybind11::object& obj);

// Exports a Tensor as a 'dltensor' capsule that shares its storage; the DLManagedTensor holds a
// reference to the storage until the consumer (or the capsule, if never consumed) deletes it.
pybind11::capsule tensorToDlpack(const Tensor& tensor);

// (device_type, device_id) as DLPack's __dlpack_device__ reports them.
pybind11::tuple dlpackDevice(const Tensor& tensor);

}  // namespace meshfuse::python

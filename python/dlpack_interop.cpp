#include "python/dlpack_interop.h"

#include <dlpack/dlpack.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "python/dlpack_versioned.h"

namespace py = pybind11;

namespace meshfuse::python {

namespace {

// DLPack v0.8 added kDLBool = 6; the v0.6 header lacks it, numpy >= 2 and torch >= 2 use it.
constexpr uint8_t kDLBoolCode = 6;

// The two capsule kinds differ in their names and in the managed struct they carry.
struct Unversioned {
  using Managed = DLManagedTensor;
  static constexpr const char* name = "dltensor";
  static constexpr const char* used_name = "used_dltensor";
};
struct Versioned {
  using Managed = DlpackManagedTensorVersioned;
  static constexpr const char* name = "dltensor_versioned";
  static constexpr const char* used_name = "used_dltensor_versioned";
};

std::string describe(DLDataType t) {
  const char* kind = "code";
  switch (t.code) {
    case kDLInt: kind = "int"; break;
    case kDLUInt: kind = "uint"; break;
    case kDLFloat: kind = "float"; break;
    case kDLBfloat: kind = "bfloat"; break;
    case kDLComplex: kind = "complex"; break;
    case kDLBoolCode: kind = "bool"; break;
    default: break;
  }
  std::string s = std::string(kind) + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

std::optional<DataType> fromDlpack(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 32) return DataType::Float;
      if (t.bits == 64) return DataType::Double;
      if (t.bits == 16) return DataType::Half;
      break;
    case kDLBfloat:
      if (t.bits == 16) return DataType::BFloat16;
      break;
    case kDLInt:
      if (t.bits == 64) return DataType::Int;
      if (t.bits == 32) return DataType::Int32;
      break;
    case kDLBoolCode:
      if (t.bits == 8) return DataType::Bool;
      break;
    default: break;
  }
  return std::nullopt;
}

DLDataType toDlpack(DataType dtype) {
  DLDataType t;
  t.lanes = 1;
  t.bits = static_cast<uint8_t>(dataTypeSize(dtype) * 8);
  switch (dtype) {
    case DataType::Float:
    case DataType::Double:
    case DataType::Half: t.code = kDLFloat; break;
    case DataType::BFloat16: t.code = kDLBfloat; break;
    case DataType::Int:
    case DataType::Int32: t.code = kDLInt; break;
    case DataType::Bool: t.code = kDLBoolCode; break;
  }
  return t;
}

std::optional<Device> fromDlpack(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU:
    case kDLCUDAHost:  // pinned host memory: the CPU reads it directly
      return Device::cpu();
    case kDLCUDA:
    case kDLCUDAManaged: return Device::cuda(d.device_id);
    default: return std::nullopt;
  }
}

// Runs the producer's deleter with the GIL held (numpy's deleter drops a Python reference), from
// whichever thread releases the last view. After interpreter shutdown the memory is left alone.
template <typename Managed>
void releaseImported(Managed* managed) {
  if (managed->deleter == nullptr || !Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  managed->deleter(managed);
}

template <typename Kind>
Tensor importCapsule(PyObject* capsule, bool uint8_as_bool) {
  using Managed = typename Kind::Managed;
  auto* managed = static_cast<Managed*>(PyCapsule_GetPointer(capsule, Kind::name));
  if (managed == nullptr) throw py::error_already_set();
  if constexpr (std::is_same_v<Kind, Versioned>) {
    if (managed->version.major != kDlpackMajorVersion)
      throw py::buffer_error("DLPack major version " + std::to_string(managed->version.major) +
                             " is not supported (this build reads version 1)");
  }
  const DLTensor& dl = managed->dl_tensor;

  // Validate everything before taking ownership, so a rejected capsule is still freed by its producer.
  std::optional<DataType> dtype = fromDlpack(dl.dtype);
  if (uint8_as_bool && dl.dtype.code == kDLUInt && dl.dtype.bits == 8 && dl.dtype.lanes == 1) dtype = DataType::Bool;
  if (!dtype)
    throw py::type_error("DLPack dtype " + describe(dl.dtype) +
                         " is not supported (meshfuse holds float32/64, float16, bfloat16, int32/64 and bool)");
  std::optional<Device> device = fromDlpack(dl.device);
  if (!device)
    throw py::value_error("DLPack device type " + std::to_string(dl.device.device_type) +
                          " is not supported (CPU and CUDA are)");
  if (dl.ndim < 0) throw py::value_error("DLPack tensor with negative ndim");

  std::vector<int64_t> shape(dl.shape, dl.shape + dl.ndim);
  std::vector<int64_t> strides =
      dl.strides ? std::vector<int64_t>(dl.strides, dl.strides + dl.ndim) : contiguousStrides(shape);
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;

  if (PyCapsule_SetName(capsule, Kind::used_name) != 0) throw py::error_already_set();
  // From here the Storage owns the managed tensor: its release runs the producer's deleter. (A
  // read-only flag needs no action: meshfuse never writes its inputs.)
  return Tensor::fromBlob(data, *dtype, std::move(shape), std::move(strides), *device,
                          [managed](void*) { releaseImported(managed); });
}

// What an exported managed tensor points at: a view of the Tensor (holding its storage) and the
// shape/strides arrays DLTensor refers to.
struct ExportContext {
  Tensor tensor;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

template <typename Managed>
void deleteExported(Managed* managed) {
  delete static_cast<ExportContext*>(managed->manager_ctx);
  delete managed;
}

// The capsule's destructor: frees the managed tensor only if no consumer took it (a consumer
// renames the capsule and becomes responsible for calling the deleter).
template <typename Kind>
void destroyCapsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, Kind::name)) return;
  // Called during garbage collection: keep any exception in flight intact.
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* managed = static_cast<typename Kind::Managed*>(PyCapsule_GetPointer(capsule, Kind::name));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  PyErr_Restore(type, value, traceback);
}

template <typename Kind>
py::capsule exportCapsule(const Tensor& tensor, bool bool_as_uint8) {
  using Managed = typename Kind::Managed;
  auto* ctx = new ExportContext{tensor, tensor.shape(), tensor.strides()};
  auto* managed = new Managed{};
  managed->manager_ctx = ctx;
  managed->deleter = &deleteExported<Managed>;
  if constexpr (std::is_same_v<Kind, Versioned>) {
    managed->version = {kDlpackMajorVersion, 0};
    managed->flags = 0;  // writable, not a copy
  }
  DLTensor& dl = managed->dl_tensor;
  dl.data = tensor.data();
  dl.byte_offset = 0;
  dl.ndim = static_cast<int32_t>(tensor.dim());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.dtype = toDlpack(tensor.dtype());
  if (bool_as_uint8 && tensor.dtype() == DataType::Bool) dl.dtype.code = kDLUInt;
  Device d = tensor.device();
  dl.device.device_type = d.type == DeviceType::CPU ? kDLCPU : kDLCUDA;
  dl.device.device_id = d.type == DeviceType::CPU ? 0 : d.index;

  PyObject* capsule = PyCapsule_New(managed, Kind::name, &destroyCapsule<Kind>);
  if (capsule == nullptr) {
    deleteExported(managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

}  // namespace

Tensor tensorFromDlpack(const py::object& obj, bool uint8_as_bool) {
  py::object capsule = obj;
  if (!PyCapsule_CheckExact(obj.ptr())) {
    if (!py::hasattr(obj, "__dlpack__"))
      throw py::type_error("expected a DLPack capsule or an object with __dlpack__ (numpy array, torch tensor), got " +
                           std::string(py::str(py::type::of(obj).attr("__name__"))));
    capsule = obj.attr("__dlpack__")();
    if (!PyCapsule_CheckExact(capsule.ptr())) throw py::type_error("__dlpack__() did not return a capsule");
  }
  PyObject* c = capsule.ptr();
  if (PyCapsule_IsValid(c, Unversioned::name)) return importCapsule<Unversioned>(c, uint8_as_bool);
  if (PyCapsule_IsValid(c, Versioned::name)) return importCapsule<Versioned>(c, uint8_as_bool);
  if (PyCapsule_IsValid(c, Unversioned::used_name) || PyCapsule_IsValid(c, Versioned::used_name))
    throw py::value_error("this DLPack capsule was already consumed (its name starts with 'used_')");
  const char* name = PyCapsule_GetName(c);
  PyErr_Clear();
  throw py::value_error(std::string("expected a capsule named 'dltensor' or 'dltensor_versioned', got '") +
                        (name ? name : "(null)") + "'");
}

py::capsule tensorToDlpack(const Tensor& tensor, bool versioned, bool bool_as_uint8) {
  if (!tensor.defined()) throw py::value_error("cannot export an undefined Tensor through DLPack");
  return versioned ? exportCapsule<Versioned>(tensor, bool_as_uint8)
                   : exportCapsule<Unversioned>(tensor, bool_as_uint8);
}

py::tuple dlpackDevice(const Tensor& tensor) {
  Device d = tensor.device();
  if (d.type == DeviceType::CPU) return py::make_tuple(static_cast<int>(kDLCPU), 0);
  return py::make_tuple(static_cast<int>(kDLCUDA), d.index);
}

}  // namespace meshfuse::python

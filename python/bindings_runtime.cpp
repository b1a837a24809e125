// meshfuse._C.Tensor: the runtime Tensor as Python sees it, mostly as a DLPack producer/consumer.
// Users never handle it directly: FusionDefinition.execute converts numpy arrays and torch tensors
// to Tensors (zero copy) and its outputs back.
#include <pybind11/stl.h>

#include "python/bindings.h"
#include "python/dlpack_interop.h"
#include "runtime/tensor.h"
#if MESHFUSE_HAVE_CUDA
#include "runtime/cuda/streams.h"
#endif

namespace py = pybind11;

namespace meshfuse::python {

namespace {

const Tensor& defined(const Tensor& t) {
  if (!t.defined()) throw py::value_error("the Tensor is undefined (it holds no storage)");
  return t;
}

// Makes the consumer's CUDA stream wait for meshfuse's work, which runs on the calling thread's
// current stream (the legacy default stream unless set). Per the protocol: None and 1 are the
// legacy default stream (already ordered), -1 asks for no synchronization, 2 is the per-thread
// default stream, anything else a stream handle.
void orderConsumerStream(const Tensor& t, const py::object& stream) {
#if MESHFUSE_HAVE_CUDA
  if (t.device().type != DeviceType::CUDA || stream.is_none()) return;
  auto handle = stream.cast<int64_t>();
  if (handle == -1 || handle == 1) return;
  int device = t.device().index;
  cuda::streamWaitStream(device, reinterpret_cast<cuda::Stream>(handle), cuda::currentStream(device));
#else
  (void)t;
  (void)stream;
#endif
}

// __dlpack__(stream=None, max_version=None, dl_device=None, copy=None), per the Python array API:
// a versioned capsule for consumers that accept DLPack 1.x (numpy >= 2 then gives a writable
// array), else the unversioned one.
py::capsule exportDlpack(const Tensor& t, const py::object& stream, const py::object& max_version,
                         const py::object& dl_device, const py::object& copy) {
  const Tensor& src = defined(t);
  if (!dl_device.is_none() && !dlpackDevice(src).equal(py::tuple(dl_device)))
    throw py::buffer_error("meshfuse Tensor on " + src.device().toString() + " cannot be exported to DLPack device " +
                           std::string(py::str(dl_device)));
  bool versioned = !max_version.is_none() && py::tuple(max_version)[0].cast<int64_t>() >= 1;
  orderConsumerStream(src, stream);
  if (!copy.is_none() && copy.cast<bool>()) return tensorToDlpack(src.clone(), versioned);
  return tensorToDlpack(src, versioned);
}

}  // namespace

void bindRuntime(py::module_& m) {
  m.def("cpu_bytes_in_use", &cpuBytesInUse, "Bytes held by meshfuse's CPU allocator (for leak tests)");
  py::class_<Tensor>(m, "Tensor")
      .def_static("from_dlpack", &tensorFromDlpack, py::arg("obj"), py::arg("uint8_as_bool") = false,
                  "Zero-copy import of a DLPack capsule or an object with __dlpack__ (uint8_as_bool: read uint8 "
                  "as Bool, for producers without DLPack's bool)")
      .def(
          "dlpack_bool_as_uint8", [](const Tensor& t) { return tensorToDlpack(defined(t), false, true); },
          "An unversioned capsule that labels Bool data uint8, for consumers without DLPack's bool")
      .def_static(
          "zeros", [](const std::vector<int64_t>& shape, DataType dtype) { return Tensor::zeros(shape, dtype); },
          py::arg("shape"), py::arg("dtype"))
      .def("__dlpack__", &exportDlpack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", [](const Tensor& t) { return dlpackDevice(defined(t)); })
      .def_property_readonly("defined", &Tensor::defined)
      .def_property_readonly("dtype", [](const Tensor& t) { return defined(t).dtype(); })
      .def_property_readonly("shape", [](const Tensor& t) { return defined(t).shape(); })
      .def_property_readonly(
          "strides", [](const Tensor& t) { return defined(t).strides(); }, "Strides in elements (not bytes)")
      .def_property_readonly("ndim", [](const Tensor& t) { return defined(t).dim(); })
      .def_property_readonly("numel", [](const Tensor& t) { return defined(t).numel(); })
      .def_property_readonly("device", [](const Tensor& t) { return defined(t).device().toString(); })
      .def_property_readonly("is_cuda", [](const Tensor& t) { return defined(t).device().type == DeviceType::CUDA; })
      .def_property_readonly("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(defined(t).data()); })
      .def("is_contiguous", [](const Tensor& t) { return defined(t).isContiguous(); })
      .def("contiguous", [](const Tensor& t) { return defined(t).contiguous(); })
      .def(
          "item",
          [](const Tensor& t, int64_t i) {
            const Tensor& d = defined(t);
            if (i < 0 || i >= d.numel()) throw py::index_error("item " + std::to_string(i) + " of " + d.toString());
            if (d.device().type != DeviceType::CPU) throw py::value_error("item() reads CPU tensors only");
            return d.item(i);
          },
          py::arg("linear_index"))
      .def("__repr__", [](const Tensor& t) {
        return t.defined() ? "Tensor(" + t.toString() + ")" : std::string("Tensor(undefined)");
      });
}

}  // namespace meshfuse::python

// FusionExecutorCache and its parameters (host_ir/fusion_executor.h). The Python FusionDefinition
// owns one cache and one MultiDeviceExecutorParams per instance.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "host_ir/fusion_executor.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace meshfuse::python {

namespace {

// One execute() input: a Tensor, a number (a scalar input) or None (an input whose mesh excludes
// this rank).
Argument toArgument(const py::handle& h, size_t i) {
  if (h.is_none()) return std::monostate{};
  if (py::isinstance<Tensor>(h)) return h.cast<Tensor>();
  if (PyBool_Check(h.ptr()) || PyLong_Check(h.ptr()) || PyFloat_Check(h.ptr())) return h.cast<double>();
  throw py::type_error("execute: input " + std::to_string(i) + " must be a meshfuse Tensor, a number or None, got " +
                       std::string(py::str(py::type::of(h).attr("__name__"))));
}

py::list execute(FusionExecutorCache& cache, const py::sequence& inputs, const MultiDeviceExecutorParams& params) {
  std::vector<Argument> args;
  args.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) args.push_back(toArgument(inputs[i], i));
  std::vector<Tensor> outputs;
  {
    // Communication may block: let other Python threads (other FusionDefinitions) run meanwhile.
    py::gil_scoped_release release;
    outputs = cache.execute(args, params);
    args.clear();  // drop imported inputs here, while the GIL can still be taken by their deleters
  }
  py::list out;
  for (Tensor& t : outputs) {
    if (t.defined())
      out.append(py::cast(std::move(t)));
    else
      out.append(py::none());
  }
  return out;
}

}  // namespace

void bindExecutor(py::module_& m) {
  py::class_<HostIrLowerParams>(m, "HostIrLowerParams")
      .def(py::init<>())
      .def_readwrite("communicator_backend", &HostIrLowerParams::communicator_backend);

  py::class_<HostIrEvaluatorParams>(m, "HostIrEvaluatorParams")
      .def(py::init<>())
      .def_readwrite("number_of_streams", &HostIrEvaluatorParams::number_of_streams)
      .def_readwrite("overlap_sm_margin", &HostIrEvaluatorParams::overlap_sm_margin)
      .def_readwrite("timeout", &HostIrEvaluatorParams::timeout, "A datetime.timedelta (or float seconds)")
      .def_readwrite("trace_path", &HostIrEvaluatorParams::trace_path)
      .def_readwrite("trace_host", &HostIrEvaluatorParams::trace_host)
      .def_readwrite("rng_offset", &HostIrEvaluatorParams::rng_offset);

  py::class_<MultiDeviceExecutorParams>(m, "MultiDeviceExecutorParams")
      .def(py::init<>())
      .def(py::init([](const MultiDeviceExecutorParams& other) { return other; }), py::arg("other"), "A copy")
      .def_readwrite("lower", &MultiDeviceExecutorParams::lower)
      .def_readwrite("executor", &MultiDeviceExecutorParams::executor);

  py::class_<FusionExecutorCache>(m, "FusionExecutorCache")
      .def(py::init([](std::shared_ptr<Fusion> fusion) {
             if (!fusion) throw UserError("FusionExecutorCache: expected a Fusion, got None");
             return std::make_unique<FusionExecutorCache>(std::move(fusion));
           }),
           py::arg("fusion"))
      .def("execute", &execute, py::arg("inputs"), py::arg("params") = MultiDeviceExecutorParams{},
           "Runs the fusion on this rank's inputs; one Tensor (or None off its mesh) per output")
      .def("report_input_error", &FusionExecutorCache::reportInputError, py::arg("error"),
           py::arg("params") = MultiDeviceExecutorParams{}, py::call_guard<py::gil_scoped_release>(),
           "Fails the other ranks' execute (they wait for this rank's inputs) with `error`; raises ValueError here")
      .def("last_host_ir", &FusionExecutorCache::lastHostIr)
      .def("last_lowered_fusion", &FusionExecutorCache::lastLoweredFusion)
      .def("last_output_shardings", &FusionExecutorCache::lastOutputShardings,
           "A Fusion whose outputs are the last execution's, placed: mesh, loop domain, bound extents")
      .def("num_cached_programs", &FusionExecutorCache::numCachedPrograms);
}

}  // namespace meshfuse::python

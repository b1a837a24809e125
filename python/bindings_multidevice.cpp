// DeviceMesh, CommunicatorBackend and the process's Communicator.
#include <pybind11/stl.h>

#include <cstdlib>

#include "backends/backend.h"
#include "multidevice/communicator.h"
#include "multidevice/device_mesh.h"
#include "python/bindings.h"
#include "runtime/tensor.h"

namespace py = pybind11;

namespace meshfuse::python {

namespace {

// Any iterable of Python ints (range, list, numpy array, ...).
std::vector<int64_t> intsOf(const py::iterable& items, const char* what) {
  std::vector<int64_t> out;
  for (py::handle h : items) {
    if (!PyLong_Check(h.ptr()) && !py::hasattr(h, "__index__"))
      throw py::type_error(std::string("DeviceMesh: ") + what + " must be integers, got " +
                           std::string(py::str(py::type::of(h).attr("__name__"))));
    PyObject* index = PyNumber_Index(h.ptr());
    if (index == nullptr) throw py::error_already_set();
    out.push_back(py::reinterpret_steal<py::int_>(index).cast<int64_t>());
  }
  return out;
}

int64_t checkedRank(const Communicator& c, int64_t rank) {
  if (rank < 0 || rank >= c.size())
    throw py::index_error("rank " + std::to_string(rank) + " is not in the world (size " + std::to_string(c.size()) +
                          ")");
  return rank;
}

bool isIntLike(py::handle h) { return PyLong_Check(h.ptr()) || py::hasattr(h, "__index__"); }

// Nested sequences of device ids (a list of lists, or what .tolist() gives for a numpy array or a
// torch tensor): their ids in row-major order, and the extents of each nesting level.
void flattenNested(py::handle items, size_t depth, std::vector<int64_t>& shape, std::vector<int64_t>& ids,
                   int64_t& leaf_depth) {
  if (isIntLike(items)) {
    if (leaf_depth < 0) leaf_depth = static_cast<int64_t>(depth);
    if (static_cast<int64_t>(depth) != leaf_depth)
      throw py::value_error("DeviceMesh: devices must be nested evenly (a rectangular array of ids)");
    ids.push_back(intsOf(py::make_tuple(items), "devices")[0]);
    return;
  }
  if (!py::isinstance<py::sequence>(items) || py::isinstance<py::str>(items))
    throw py::type_error(std::string("DeviceMesh: devices must be integers, got ") +
                         std::string(py::str(py::type::of(items).attr("__name__"))));
  const auto n = static_cast<int64_t>(py::len(items));
  if (shape.size() <= depth) {
    if (leaf_depth >= 0)
      throw py::value_error("DeviceMesh: devices must be nested evenly (a rectangular array of ids)");
    shape.push_back(n);
  } else if (shape[depth] != n) {
    throw py::value_error("DeviceMesh: devices must be nested evenly (rows of " + std::to_string(shape[depth]) +
                          " and of " + std::to_string(n) + " ids)");
  }
  for (py::handle item : items) flattenNested(item, depth + 1, shape, ids, leaf_depth);
}

// devices: a flat iterable of ids (range, list, 1-D array) with an optional `shape`, or an N-D
// array of ids (nested lists, numpy array, torch tensor) whose shape is the mesh's, as nvFuser's
// DeviceMesh(torch.arange(8).view(2, 4)).
DeviceMesh makeMesh(const py::object& devices, const py::object& shape) {
  py::object items = py::hasattr(devices, "tolist") ? devices.attr("tolist")() : devices;
  const bool nested = py::isinstance<py::sequence>(items) && py::len(items) > 0 && !isIntLike(items[py::int_(0)]);
  if (!nested) {
    if (isIntLike(items)) throw py::type_error("DeviceMesh: devices must be a sequence of device ids, got one id");
    std::vector<int64_t> ids = intsOf(items.cast<py::iterable>(), "devices");
    if (shape.is_none()) return DeviceMesh(std::move(ids));
    return DeviceMesh(std::move(ids), intsOf(shape.cast<py::iterable>(), "shape"));
  }
  std::vector<int64_t> nested_shape, ids;
  int64_t leaf_depth = -1;
  flattenNested(items, 0, nested_shape, ids, leaf_depth);
  if (!shape.is_none() && intsOf(shape.cast<py::iterable>(), "shape") != nested_shape)
    throw py::value_error("DeviceMesh: shape " + std::string(py::str(shape)) +
                          " differs from the shape of the nested devices " + shapeToString(nested_shape));
  return DeviceMesh(std::move(ids), std::move(nested_shape));
}

}  // namespace

void bindMultidevice(py::module_& m) {
  py::enum_<CommunicatorBackend>(m, "CommunicatorBackend")
      .value("auto", CommunicatorBackend::Auto)
      .value("nccl", CommunicatorBackend::Nccl)
      .value("ucc", CommunicatorBackend::Ucc)
      .value("mpi", CommunicatorBackend::Mpi)
      .value("gloo", CommunicatorBackend::Gloo)
      .value("cuda", CommunicatorBackend::Cuda);

  py::class_<DeviceMesh>(m, "DeviceMesh")
      .def(py::init(&makeMesh), py::arg("devices"), py::arg("shape") = py::none(),
           "A mesh of device ids (world ranks): a flat sequence with an optional `shape` (1 to 3 dims, mesh_x "
           "last; 1-D by default), or an N-D array of ids (nested lists, numpy, torch) whose shape is the mesh's")
      .def_property_readonly("size", py::overload_cast<>(&DeviceMesh::size, py::const_))
      .def_property_readonly("devices", &DeviceMesh::devices)
      .def_property_readonly("shape", &DeviceMesh::shape)
      .def_property_readonly("ndim", &DeviceMesh::rank)
      .def("size_along", py::overload_cast<ParallelType>(&DeviceMesh::size, py::const_), py::arg("parallel_type"),
           "The extent of the mesh dimension the parallel type uses (1 when the mesh has no such dimension)")
      .def("coordinate", &DeviceMesh::coordinate, py::arg("device"), py::arg("parallel_type"))
      .def("team", py::overload_cast<int64_t, ParallelType>(&DeviceMesh::team, py::const_), py::arg("device"),
           py::arg("parallel_type"))
      .def("index_of", &DeviceMesh::indexOf, py::arg("device"))
      .def("__contains__", &DeviceMesh::has)
      .def("__len__", py::overload_cast<>(&DeviceMesh::size, py::const_))
      .def(
          "__eq__", [](const DeviceMesh& a, const DeviceMesh& b) { return a == b; }, py::is_operator())
      .def("__hash__",
           [](const DeviceMesh& m) {
             return py::hash(py::make_tuple(py::tuple(py::cast(m.devices())), py::tuple(py::cast(m.shape()))));
           })
      .def("__repr__", &DeviceMesh::toString)
      // Pickled as its ids and shape, so that a module holding a mesh (TransformerLayer) saves whole.
      .def(py::pickle([](const DeviceMesh& m) { return py::make_tuple(m.devices(), m.shape()); },
                      [](const py::tuple& t) {
                        if (t.size() != 2) throw py::value_error("DeviceMesh: bad pickled state");
                        return DeviceMesh(t[0].cast<std::vector<int64_t>>(), t[1].cast<std::vector<int64_t>>());
                      }));

  constexpr auto ref = py::return_value_policy::reference;
  py::class_<Communicator, std::unique_ptr<Communicator, py::nodelete>>(m, "Communicator")
      .def_static(
          "instance",
          []() -> Communicator& {
            (void)Communicator::instance();  // started here, if not yet
            // The rank's record of itself (communicator.cpp: a process it starts is refused) is set in
            // the C environment, which os.environ does not see: a subprocess given env=dict(os.environ)
            // would lose it. Mirrored once.
            if (const char* launched = std::getenv("MESHFUSE_LAUNCHED_RANK")) {
              py::object environ = py::module_::import("os").attr("environ");
              if (!environ.contains("MESHFUSE_LAUNCHED_RANK")) environ["MESHFUSE_LAUNCHED_RANK"] = launched;
            }
            return Communicator::instance();
          },
          ref, "The process's communicator (initializes MPI on first use; a world of one without a launcher)")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("local_rank", &Communicator::localRank)
      .def_property_readonly("local_size", &Communicator::localSize)
      .def_property_readonly("node_id", &Communicator::nodeId,
                             "This rank's node (0 .. node_count-1, nodes in order of their lowest rank)")
      .def_property_readonly("node_count", &Communicator::nodeCount)
      .def(
          "node_of", [](const Communicator& c, int64_t rank) { return c.nodes().nodeOf(checkedRank(c, rank)); },
          py::arg("rank"), "The node a world rank runs on")
      .def(
          "node_name",
          [](const Communicator& c, int64_t node) {
            if (node < 0 || node >= c.nodeCount())
              throw py::index_error("node " + std::to_string(node) + " is not in 0.." +
                                    std::to_string(c.nodeCount() - 1));
            return c.nodes().nodeName(node);
          },
          py::arg("node"), "A node's host name (that of its lowest rank)")
      .def("barrier", &Communicator::barrier, py::call_guard<py::gil_scoped_release>())
      .def("available_backends", &Communicator::availableBackends)
      .def("is_available", &Communicator::isAvailable, py::arg("backend"))
      .def("why_unavailable", &Communicator::whyUnavailable, py::arg("backend"),
           "'' when the backend is available, else why (a plugin that did not load says what the loader said)")
      .def_static("_exists", &Communicator::exists, "Whether instance() has run (asking does not start MPI)")
      .def(
          "_abort_job",
          [](Communicator& c, int code, const std::string& why) {
            py::gil_scoped_release release;  // MPI_Abort may take a while to end the other ranks
            c.abort(code, why);
          },
          py::arg("code"), py::arg("why"), "Ends every process of the job (MPI_Abort); does not return");
}

}  // namespace meshfuse::python

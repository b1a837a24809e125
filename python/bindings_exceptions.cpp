// C++ exceptions -> Python exceptions. UserError (a std::invalid_argument) is a mistake of the
// user: ValueError. A communication that ran past its deadline is CommunicationTimeout, a
// subclass of TimeoutError, so `except TimeoutError` catches it. Other std::runtime_errors keep
// pybind11's default mapping to RuntimeError.
#include <pybind11/pybind11.h>

#include "backends/backend.h"
#include "ir/ir.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace meshfuse::python {

void bindExceptions(py::module_& m) {
  py::register_exception<CommunicationTimeout>(m, "CommunicationTimeout", PyExc_TimeoutError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const UserError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
}

}  // namespace meshfuse::python

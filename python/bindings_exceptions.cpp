// C++ exceptions -> Python exceptions. UserError (a std::invalid_argument) is a mistake of the
// user: ValueError. A communication that ran past its deadline is CommunicationTimeout, a
// subclass of TimeoutError, so `except TimeoutError` catches it. Other std::runtime_errors keep
// pybind11's default mapping to RuntimeError.
#include <pybind11/pybind11.h>

#include "backends/backend.h"
#include "backends/wait_interrupt.h"
#include "ir/ir.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace meshfuse::python {

namespace {
// Runs Python's signal handlers from a long wait (backends/wait_interrupt.h): true when one raised
// (KeyboardInterrupt, or whatever a user's SIGINT handler raises), whose error is dropped here and
// raised again as the wait's WaitInterrupted, a KeyboardInterrupt, once the job's policy has run.
bool pythonInterruptRequested() {
  if (Py_IsInitialized() == 0) return false;
  const py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() == 0) return false;
  PyErr_Clear();
  return true;
}
}  // namespace

void bindExceptions(py::module_& m) {
  py::register_exception<CommunicationTimeout>(m, "CommunicationTimeout", PyExc_TimeoutError);
  setWaitInterruptCheck(&pythonInterruptRequested);
  // Not from an interpreter that is shutting down: the waits then run without the check.
  py::module_::import("atexit").attr("register")(py::cpp_function([] { setWaitInterruptCheck(nullptr); }));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const WaitInterrupted& e) {  // before CommunicationTimeout's translator, registered earlier
      PyErr_SetString(PyExc_KeyboardInterrupt, e.what());
    } catch (const UserError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
}

}  // namespace meshfuse::python

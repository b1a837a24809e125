// The pieces of the meshfuse._C extension; module.cpp calls each in dependency order (enums and
// IR first, since the executor and multidevice bindings take IR objects as arguments).
#pragma once
#include <pybind11/pybind11.h>

namespace meshfuse::python {

void bindExceptions(pybind11::module_& m);
void bindIr(pybind11::module_& m);
void bindRuntime(pybind11::module_& m);
void bindMultidevice(pybind11::module_& m);
void bindExecutor(pybind11::module_& m);

}  // namespace meshfuse::python

// meshfuse._C: the compiled half of the Python front end. The package (python/meshfuse/) builds the
// user-facing API (FusionDefinition, shard_tensor, ...) on these bindings.
#include "python/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "meshfuse C++ bindings (use the meshfuse package, not this module directly)";
  meshfuse::python::bindExceptions(m);
  meshfuse::python::bindIr(m);
  meshfuse::python::bindRuntime(m);
  meshfuse::python::bindMultidevice(m);
  meshfuse::python::bindExecutor(m);
}

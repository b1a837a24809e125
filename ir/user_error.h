// The one exception type for a user's mistake: in a definition (ops, shardings, meshes) or in
// execute()'s inputs. Python sees ValueError. Its own header so that the mesh, which the IR
// includes, raises it too.
#pragma once
#include <stdexcept>

namespace meshfuse {

class UserError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace meshfuse

#include "backends/op_label.h"

namespace meshfuse {

std::string OpLabel::toString() const {
  std::string text = meshfuse::toString(backend->type()) + " " + op;
  if (reduce) text += "(" + meshfuse::toString(*reduce) + ")";
  if (peer_role) text += std::string(" ") + peer_role + " " + std::to_string(peer);
  if (numel > 0) text += " (" + meshfuse::toString(dtype) + ", " + std::to_string(numel) + " elements)";
  const int64_t me = backend->rankInTeam();
  return text + " on team " + teamToString(backend->team()) + " at team rank " + std::to_string(me) + " (world rank " +
         std::to_string(backend->team()[static_cast<size_t>(me)]) + ")";
}

}  // namespace meshfuse

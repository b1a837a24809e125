// Connecting a team's Gloo context without any shared filesystem or store server: every member
// makes a TCP pair for every other member (on the device gloo_interface.h chooses), the members
// exchange the pairs' listening addresses in one allgather over the Communicator's MPI, and each
// pair connects to the address its peer made for it.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace gloo {
class Context;
}

namespace meshfuse {
class Communicator;
}

namespace meshfuse::gloo_backend {

// Collective over `team` (every member calls it at the same point). `timeout` bounds every wait.
// Logs the device it chose at MESHFUSE_DEBUG=INFO.
std::shared_ptr<::gloo::Context> connectTeam(Communicator& communicator, const std::vector<int64_t>& team,
                                             int rank_in_team, std::chrono::milliseconds timeout);

}  // namespace meshfuse::gloo_backend

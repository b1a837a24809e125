// Connecting a team's Gloo context: a TCP device (loopback when the whole team is on this host,
// else this host's name, or the interface named by MESHFUSE_GLOO_IFACE) and a full mesh of pairs
// that find each other through a FileStore in a fresh directory. Gloo has no MPI rendezvous in
// this snapshot, so team rank 0 creates the directory and the Communicator (MPI) tells the team
// where it is; a reused FileStore directory would abort with "File already exists".
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

// Collective over `team` (every member calls it at the same point). The store directory (under
// MESHFUSE_GLOO_STORE_DIR, default /tmp) is removed again before this returns: once every member
// is connected (a Gloo barrier says so) nobody reads it any more. `timeout` bounds every wait.
std::shared_ptr<::gloo::Context> connectTeam(Communicator& communicator, const std::vector<int64_t>& team,
                                             int rank_in_team, std::chrono::milliseconds timeout);

}  // namespace meshfuse::gloo_backend

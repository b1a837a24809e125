// A UCC team over a meshfuse team, created collectively by its members in the process's context
// (ucc_context.h). Its out-of-band allgather (UCC's exchange of context ids and team-id agreement)
// goes through the Communicator's MPI (ucc_oob.h): a member that never arrives fails team creation
// on the others with a CommunicationTimeout instead of a hang.
#pragma once
#include <ucc/api/ucc.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace meshfuse {
class Communicator;
}

namespace meshfuse::ucc {

struct Oob;

class Team {
 public:
  // Blocks until every member has joined, or `timeout` passes (CommunicationTimeout).
  Team(Communicator& communicator, const std::vector<int64_t>& team, int64_t rank_in_team,
       std::chrono::milliseconds timeout);
  // Destroys the UCC team unless the Communicator is broken (a peer may be gone).
  ~Team();
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;
  ucc_team_h handle() const { return team_; }

 private:
  Communicator& communicator_;
  std::unique_ptr<Oob> oob_;  // UCC keeps a pointer to it
  ucc_team_h team_ = nullptr;
};

}  // namespace meshfuse::ucc

// UCC's out-of-band allgather over the Communicator's MPI (Communicator::allgatherBytes, which has
// a deadline), for the process's context (over the world) and for each team (over its members).
// UCC's OOB is non-blocking (post, then test); ours completes inside the post: every member makes
// the same exchanges in the same order. A failure (a member that never arrives: a
// CommunicationTimeout) is kept and rethrown by whoever drives the UCC call.
#pragma once
#include <ucc/api/ucc.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <vector>

namespace meshfuse {
class Communicator;
}

namespace meshfuse::ucc {

struct Oob {
  Communicator* communicator;
  std::vector<int64_t> members;  // world ranks, in OOB endpoint order
  std::chrono::steady_clock::time_point deadline;
  std::exception_ptr error;  // the first failure of an exchange

  // UCC's description of this exchange for the member at `my_index`; refers to *this.
  ucc_oob_coll_t coll(int64_t my_index);
  // Rethrows the first failure, if any.
  void rethrow() const;
};

// MESHFUSE_TIMEOUT seconds, 300 s by default: how long setting up a context or team may wait.
std::chrono::milliseconds timeoutFromEnvironment();

}  // namespace meshfuse::ucc

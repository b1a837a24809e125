// What a rank does when a wait on a communication runs past its deadline (MESHFUSE_TIMEOUT).
// A half-done collective cannot be cancelled or resumed, and the other ranks may be waiting in a
// matching one that will never complete, so by default the rank ends the whole job:
//   MESHFUSE_ABORT_ON_TIMEOUT unset or 1: print the error, with the rank, to stderr, then
//     Communicator::abort (MPI_Abort on the world, code 1): every rank exits, mpirun exits non-zero.
//   MESHFUSE_ABORT_ON_TIMEOUT=0: raise the CommunicationTimeout (Python: an exception) so the
//     caller can report it; the communicator is unusable afterwards (marked broken, so exit skips
//     MPI_Finalize, which would wait for the missing rank) and the process should exit.
// NCCL aborts its own communicators in its Work (ncclCommAbort) before the timeout reaches here.
#pragma once
#include <string>

#include "backends/backend.h"

namespace meshfuse {

// Read at each timeout (never on the hot path), so a test may change the variable at run time.
bool abortOnTimeout();

// Adds `during` (what the executor was doing) to e's message, then aborts or rethrows per the policy.
[[noreturn]] void handleCommunicationTimeout(const CommunicationTimeout& e, const char* during);

// Runs fn(); a CommunicationTimeout escaping it goes to handleCommunicationTimeout.
template <typename Fn>
decltype(auto) withTimeoutPolicy(const char* during, Fn&& fn) {
  try {
    return fn();
  } catch (const CommunicationTimeout& e) {
    handleCommunicationTimeout(e, during);
  }
}

}  // namespace meshfuse

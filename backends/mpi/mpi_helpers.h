// Small pieces of MPI plumbing shared by the Communicator and the MPI backend: error checks,
// the void* <-> MPI_Comm handle conversion behind Communicator::mpiCommFor, and the polling loop
// that turns MPI_Test into a wait with a deadline.
#pragma once
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace meshfuse::mpi {

// Throws std::runtime_error naming `what` and MPI's message when rc is not MPI_SUCCESS (only
// reached on communicators whose error handler is MPI_ERRORS_RETURN).
void check(int rc, const char* what);

// Communicator::mpiCommFor returns the MPI_Comm handle bit-for-bit in a void* (Open MPI's
// MPI_Comm is a pointer, MPICH's an int: both fit).
inline void* toHandle(MPI_Comm comm) {
  static_assert(sizeof(MPI_Comm) <= sizeof(void*));
  void* handle = nullptr;
  std::memcpy(&handle, &comm, sizeof(MPI_Comm));
  return handle;
}
inline MPI_Comm fromHandle(void* handle) {
  MPI_Comm comm;
  std::memcpy(&comm, &handle, sizeof(MPI_Comm));
  return comm;
}

bool isFinalized();

// Tests `requests` until all complete (true) or `deadline` passes (false; the requests stay
// pending), backing off as backends/poll_until.h says.
bool pollUntil(std::vector<MPI_Request>& requests, std::chrono::steady_clock::time_point deadline);

// "0.200 s": a wait's length for timeout messages.
std::string secondsToString(std::chrono::steady_clock::duration d);

}  // namespace meshfuse::mpi

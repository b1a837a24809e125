#include "backends/mpi/mpi_helpers.h"

#include <cstdio>
#include <stdexcept>

#include "backends/poll_until.h"

namespace meshfuse::mpi {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, message, &length);
  throw std::runtime_error(std::string(what) + " failed: " + std::string(message, static_cast<size_t>(length)));
}

bool isFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

bool pollUntil(std::vector<MPI_Request>& requests, std::chrono::steady_clock::time_point deadline) {
  return meshfuse::pollUntil(
      [&] {
        int done = 0;
        check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE),
              "MPI_Testall");
        return done != 0;
      },
      deadline);
}

std::string secondsToString(std::chrono::steady_clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f s", std::chrono::duration<double>(d).count());
  return text;
}

}  // namespace meshfuse::mpi

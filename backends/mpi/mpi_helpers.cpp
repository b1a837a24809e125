#include "backends/mpi/mpi_helpers.h"

#include <cstdio>
#include <stdexcept>
#include <thread>

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
  using Clock = std::chrono::steady_clock;
  constexpr auto kSpin = std::chrono::microseconds(100);
  constexpr auto kYield = std::chrono::milliseconds(200);
  const auto start = Clock::now();
  auto nap = std::chrono::microseconds(20);
  while (true) {
    int done = 0;
    check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) return true;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    const auto waited = now - start;
    if (waited < kSpin) continue;
    if (waited < kYield) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(nap, deadline - now));
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
}

std::string secondsToString(std::chrono::steady_clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f s", std::chrono::duration<double>(d).count());
  return text;
}

}  // namespace meshfuse::mpi

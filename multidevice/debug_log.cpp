#include "multidevice/debug_log.h"

#include <mpi.h>
#include <strings.h>

#include <cstdio>
#include <cstdlib>

namespace meshfuse::debug {

Level parseLevel(const char* value) {
  if (value == nullptr) return Level::Off;
  if (strcasecmp(value, "INFO") == 0) return Level::Info;
  if (strcasecmp(value, "WARN") == 0) return Level::Warn;
  return Level::Off;
}

int detail::readLevelFromEnv() {
  int v = static_cast<int>(parseLevel(std::getenv("MESHFUSE_DEBUG")));
  int unread = -1;
  // A concurrent setLevel wins over the environment.
  if (!cached_level.compare_exchange_strong(unread, v, std::memory_order_relaxed)) return unread;
  return v;
}

void setLevel(Level l) { detail::cached_level.store(static_cast<int>(l), std::memory_order_relaxed); }

std::string prefix() {
  long long rank = 0;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    rank = r;
  } else {
    for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
      if (const char* env = std::getenv(name)) {
        rank = std::atoll(env);
        break;
      }
  }
  return "[meshfuse rank " + std::to_string(rank) + "] ";
}

void log(Level at, const std::string& message) {
  if (!enabled(at)) return;
  const std::string head = prefix() + (at == Level::Warn ? "WARN " : "");
  std::string out = head;
  for (char c : message) {
    out += c;
    if (c == '\n') out += head;
  }
  if (out.size() >= head.size() && out.compare(out.size() - head.size(), head.size(), head) == 0)
    out.resize(out.size() - head.size());  // a message ending in '\n' gets no empty prefixed line
  if (out.empty() || out.back() != '\n') out += '\n';
  // One fwrite per message keeps lines of different ranks (and threads) from interleaving mid-line.
  std::fwrite(out.data(), 1, out.size(), stderr);
  std::fflush(stderr);
}

}  // namespace meshfuse::debug

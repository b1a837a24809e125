// What messages say about an operation of a host-driven backend (MPI, UCC). Kept as parts and
// turned into text only when a message is needed: building strings on every call would cost
// microseconds per small collective.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "backends/backend.h"

namespace meshfuse {

struct OpLabel {
  const char* op;          // "allreduce"
  const Backend* backend;  // its type, team and my place in it (a backend outlives its Works)
  DataType dtype = DataType::Float;
  int64_t numel = 0;
  std::optional<ReduceOp> reduce = std::nullopt;
  const char* peer_role = nullptr;  // "to root", "from team rank", ...
  int64_t peer = -1;
  // "mpi reduce(sum) to root 1 (Float, 53 elements) on team [0, 1] at team rank 0 (world rank 0)"
  std::string toString() const;
};

}  // namespace meshfuse

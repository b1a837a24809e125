// Names of backends and reduce ops, the completed Work, and the Backend base constructor.
#include "backends/backend.h"

#include <algorithm>

namespace meshfuse {

std::string toString(CommunicatorBackend b) {
  switch (b) {
    case CommunicatorBackend::Auto: return "auto";
    case CommunicatorBackend::Nccl: return "nccl";
    case CommunicatorBackend::Ucc: return "ucc";
    case CommunicatorBackend::Mpi: return "mpi";
    case CommunicatorBackend::Gloo: return "gloo";
    case CommunicatorBackend::Cuda: return "cuda";
  }
  return "unknown(" + std::to_string(static_cast<int>(b)) + ")";
}

std::string toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "unknown(" + std::to_string(static_cast<int>(op)) + ")";
}

std::string teamToString(const std::vector<int64_t>& team) {
  std::string out = "[";
  for (size_t i = 0; i < team.size(); ++i) out += (i ? ", " : "") + std::to_string(team[i]);
  return out + "]";
}

namespace {
class CompletedWork final : public Work {
 public:
  void wait(std::chrono::milliseconds) override {}
  bool test() override { return true; }
};
}  // namespace

std::unique_ptr<Work> completedWork() { return std::make_unique<CompletedWork>(); }

namespace {
int64_t indexInTeam(const std::vector<int64_t>& team, int64_t world_rank, CommunicatorBackend type) {
  auto it = std::find(team.begin(), team.end(), world_rank);
  if (it == team.end()) {
    throw std::invalid_argument(toString(type) + " backend: world rank " + std::to_string(world_rank) +
                                " is not a member of team " + teamToString(team));
  }
  return static_cast<int64_t>(it - team.begin());
}
}  // namespace

Backend::Backend(CommunicatorBackend type, std::vector<int64_t> team, int64_t my_world_rank)
    : type_(type), team_(std::move(team)), rank_in_team_(indexInTeam(team_, my_world_rank, type)) {}

}  // namespace meshfuse

#include "multidevice/node_topology.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

namespace meshfuse {

namespace {

// Linux host names are at most 64 bytes (HOST_NAME_MAX); one more for the terminator.
constexpr int kHostBytes = 65;

std::string hostName() {
  char name[kHostBytes] = {};
  if (gethostname(name, kHostBytes - 1) != 0) return "unknown-host";
  return name;
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(std::string("meshfuse: node discovery: ") + what + " failed");
}

}  // namespace

NodeTopology::NodeTopology(std::string host)
    : node_of_rank_{0}, local_rank_of_rank_{0}, local_size_of_node_{1}, node_names_{std::move(host)} {}

NodeTopology::NodeTopology(const std::vector<int64_t>& leader_of_rank, const std::vector<std::string>& host_of_leader) {
  // Node ids in order of the nodes' lowest ranks (a leader is the lowest rank of its node).
  std::map<int64_t, int64_t> node_of_leader;
  for (int64_t leader : std::set<int64_t>(leader_of_rank.begin(), leader_of_rank.end())) {
    if (leader < 0 || leader >= static_cast<int64_t>(leader_of_rank.size()))
      throw std::invalid_argument("NodeTopology: leader " + std::to_string(leader) + " is not a rank of the world");
    node_of_leader.emplace(leader, static_cast<int64_t>(node_of_leader.size()));
    node_names_.push_back(host_of_leader.at(static_cast<size_t>(leader)));
  }
  local_size_of_node_.assign(node_names_.size(), 0);
  for (int64_t leader : leader_of_rank) {
    const int64_t node = node_of_leader.at(leader);
    node_of_rank_.push_back(node);
    local_rank_of_rank_.push_back(local_size_of_node_[static_cast<size_t>(node)]++);
  }
}

NodeTopology NodeTopology::discover() {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm node;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
        "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  // The key (world rank) orders each node's communicator, so its rank 0 is the node's lowest rank.
  int leader = rank;
  check(MPI_Bcast(&leader, 1, MPI_INT, 0, node), "MPI_Bcast of the node's lowest rank");
  MPI_Comm_free(&node);
  std::vector<int> leaders(static_cast<size_t>(size));
  check(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather of nodes");

  std::vector<char> names(static_cast<size_t>(size) * kHostBytes, '\0');
  std::string mine = hostName();
  mine.resize(kHostBytes - 1);
  check(MPI_Allgather(mine.c_str(), kHostBytes, MPI_CHAR, names.data(), kHostBytes, MPI_CHAR, MPI_COMM_WORLD),
        "MPI_Allgather of host names");
  std::vector<int64_t> leader_of_rank(leaders.begin(), leaders.end());
  std::vector<std::string> host_of_rank;
  for (int r = 0; r < size; ++r) host_of_rank.emplace_back(names.data() + static_cast<size_t>(r) * kHostBytes);
  return NodeTopology(leader_of_rank, host_of_rank);
}

std::vector<int64_t> NodeTopology::nodesOf(const std::vector<int64_t>& team) const {
  std::vector<int64_t> nodes;
  for (int64_t r : team)
    if (std::find(nodes.begin(), nodes.end(), nodeOf(r)) == nodes.end()) nodes.push_back(nodeOf(r));
  return nodes;
}

std::string NodeTopology::describe(const std::vector<int64_t>& team) const {
  std::string out;
  for (int64_t node : nodesOf(team)) {
    std::vector<int64_t> members;
    for (int64_t r : team)
      if (nodeOf(r) == node) members.push_back(r);
    out += out.empty() ? "" : "; ";
    out += members.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < members.size(); ++i) out += (i ? ", " : "") + std::to_string(members[i]);
    out += " on node " + std::to_string(node) + " (" + nodeName(node) + ")";
  }
  return out;
}

bool NodeTopology::membersShareAGpu(const std::vector<int64_t>& team, int64_t gpus_per_node) const {
  if (gpus_per_node <= 0) return true;
  std::set<std::pair<int64_t, int64_t>> gpus;  // (node, GPU)
  for (int64_t r : team)
    if (!gpus.emplace(nodeOf(r), localRankOf(r) % gpus_per_node).second) return true;
  return false;
}

}  // namespace meshfuse

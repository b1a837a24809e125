// Which node every rank of the world runs on, as MPI's shared-memory split sees it
// (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)): node ids count nodes in the order of their lowest
// world rank, a rank's local rank is its place among the ranks of its node (in world-rank order),
// and each node is named by the host name of its lowest rank. Every rank holds the same table, so
// decisions made from it (`auto` per team, CUDA IPC's one-node rule) agree on every rank without
// another exchange.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace meshfuse {

class NodeTopology {
 public:
  // A world of one rank on one node named `host`.
  explicit NodeTopology(std::string host = "localhost");
  // leader_of_rank[r]: the lowest world rank on rank r's node; host_of_leader[l]: that node's
  // host name, for every leader l (other entries are ignored).
  NodeTopology(const std::vector<int64_t>& leader_of_rank, const std::vector<std::string>& host_of_leader);
  // Collective over MPI_COMM_WORLD (every rank, once, at start-up).
  static NodeTopology discover();

  int64_t nodeCount() const { return static_cast<int64_t>(node_names_.size()); }
  int64_t nodeOf(int64_t rank) const { return node_of_rank_.at(static_cast<size_t>(rank)); }
  int64_t localRankOf(int64_t rank) const { return local_rank_of_rank_.at(static_cast<size_t>(rank)); }
  int64_t localSizeOf(int64_t rank) const { return local_size_of_node_.at(static_cast<size_t>(nodeOf(rank))); }
  const std::string& nodeName(int64_t node) const { return node_names_.at(static_cast<size_t>(node)); }

  // The distinct nodes the team's members run on, in order of first appearance in the team.
  std::vector<int64_t> nodesOf(const std::vector<int64_t>& team) const;
  // "ranks 0, 1 on node 0 (host-a); ranks 2, 3 on node 1 (host-b)": for errors about a team.
  std::string describe(const std::vector<int64_t>& team) const;
  // Whether two members of `team` would use one GPU, each rank using GPU (local rank % gpus) of
  // its node, every node having `gpus_per_node` GPUs (NCCL refuses two ranks of one
  // communicator on one GPU). True when gpus_per_node is 0.
  bool membersShareAGpu(const std::vector<int64_t>& team, int64_t gpus_per_node) const;

 private:
  std::vector<int64_t> node_of_rank_, local_rank_of_rank_, local_size_of_node_;
  std::vector<std::string> node_names_;
};

}  // namespace meshfuse

// Rules that only show on several nodes (tests/python/test_cluster.py runs this suite on
// scripts/cluster-sim's simulated nodes; on one node every test here skips): CUDA IPC refuses a
// team across nodes on every member, naming the nodes, before touching any GPU, and accepts the
// members of one node (which then fail, or not, on their GPUs alone).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "backend_test_utils.h"

namespace meshfuse {
namespace {

using namespace meshfuse::testing;

Communicator& comm() { return Communicator::instance(); }

// The message of the std::invalid_argument that asking for (type, team)'s backend throws, "" if none.
std::string refusal(CommunicatorBackend type, const std::vector<int64_t>& team) {
  try {
    comm().backend(type, team);
  } catch (const std::invalid_argument& e) {
    return e.what();
  } catch (const std::exception&) {  // e.g. no GPU here: not the rule under test
  }
  return "";
}

TEST(MultiNode, CudaIpcRefusesATeamAcrossNodesNamingThem) {
  if (comm().nodeCount() < 2) GTEST_SKIP() << "needs ranks on two nodes (scripts/cluster-sim)";
  if (!comm().isAvailable(CommunicatorBackend::Cuda)) GTEST_SKIP() << "no cuda backend in this build";
  const std::string msg = refusal(CommunicatorBackend::Cuda, teamOf(TeamKind::World));
  EXPECT_NE(msg.find("cuda backend, team " + teamToString(teamOf(TeamKind::World))), std::string::npos) << msg;
  EXPECT_NE(msg.find("spans " + std::to_string(comm().nodeCount()) + " nodes"), std::string::npos) << msg;
  for (int64_t node = 0; node < comm().nodeCount(); ++node)
    EXPECT_NE(msg.find("on node " + std::to_string(node) + " (" + comm().nodes().nodeName(node) + ")"),
              std::string::npos)
        << msg;

  std::vector<int64_t> my_node;
  for (int64_t r = 0; r < comm().size(); ++r)
    if (comm().nodes().nodeOf(r) == comm().nodeId()) my_node.push_back(r);
  EXPECT_EQ(refusal(CommunicatorBackend::Cuda, my_node).find("spans"), std::string::npos)
      << "a team within one node is not refused for its nodes";
  comm().barrier();
}

TEST(MultiNode, AutoOnHostTensorsIsMpiForEveryTeam) {
  if (comm().nodeCount() < 2) GTEST_SKIP() << "needs ranks on two nodes (scripts/cluster-sim)";
  EXPECT_EQ(comm().resolve(CommunicatorBackend::Auto, Device::cpu(), teamOf(TeamKind::World)),
            CommunicatorBackend::Mpi);
  EXPECT_EQ(comm().resolve(CommunicatorBackend::Auto, Device::cpu(), teamOf(TeamKind::Parity)),
            CommunicatorBackend::Mpi);
}

}  // namespace
}  // namespace meshfuse

// The Communicator under mpirun: world and node sizes, the backend cache, team validation and
// the bootstrap allgather of bytes, on the world and on two sub-teams at once.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <numeric>

#include "backends/mpi/mpi_helpers.h"
#include "multidevice/communicator.h"

namespace meshfuse {
namespace {

Communicator& comm() { return Communicator::instance(); }

TEST(CommunicatorMp, WorldAndNodeMatchMpi) {
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(comm().rank(), rank);
  EXPECT_EQ(comm().size(), size);
  comm().barrier();
}

// Node awareness against MPI's own shared-memory split (ctest runs one node; scripts/cluster-sim
// runs this suite on several): same local ranks, one node id per node, nodes named by host.
TEST(CommunicatorMp, NodesMatchMpisSharedMemorySplit) {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, static_cast<int>(comm().rank()), MPI_INFO_NULL, &node);
  int local_rank = -1, local_size = -1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  EXPECT_EQ(comm().localRank(), local_rank);
  EXPECT_EQ(comm().localSize(), local_size);
  std::vector<int64_t> ids(static_cast<size_t>(local_size));
  const int64_t mine = comm().nodeId();
  MPI_Allgather(&mine, 1, MPI_INT64_T, ids.data(), 1, MPI_INT64_T, node);
  MPI_Comm_free(&node);
  for (int64_t id : ids) EXPECT_EQ(id, mine) << "ranks of one node disagree on its id";
  int leaders = 0, leader = local_rank == 0 ? 1 : 0;
  MPI_Allreduce(&leader, &leaders, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(comm().nodeCount(), leaders);
  char host[65] = {};
  gethostname(host, 64);
  EXPECT_EQ(comm().nodes().nodeName(mine), host);
  for (int64_t r = 0; r < comm().size(); ++r) EXPECT_LT(comm().nodes().nodeOf(r), comm().nodeCount());
}

TEST(CommunicatorMp, BackendsAreCachedPerTypeAndTeam) {
  std::vector<int64_t> world(static_cast<size_t>(comm().size()));
  std::iota(world.begin(), world.end(), 0);
  std::vector<int64_t> reversed(world.rbegin(), world.rend());
  Backend& a = comm().backend(CommunicatorBackend::Mpi, world);
  Backend& b = comm().backend(CommunicatorBackend::Mpi, reversed);
  EXPECT_EQ(&a, &comm().backend(CommunicatorBackend::Mpi, world));
  EXPECT_EQ(a.team(), world);
  EXPECT_EQ(b.team(), reversed);  // the given order is kept: team rank i = reversed[i]
  EXPECT_EQ(b.rankInTeam(), comm().size() - 1 - comm().rank());
  if (comm().size() > 1) EXPECT_NE(&a, &b);
}

TEST(CommunicatorMp, TeamsWithoutMeOrOutsideTheWorldAreRejected) {
  const int64_t n = comm().size(), me = comm().rank();
  if (n > 1) {
    const int64_t other = (me + 1) % n;
    EXPECT_THROW(comm().backend(CommunicatorBackend::Mpi, {other}), std::invalid_argument);
  }
  try {
    comm().backend(CommunicatorBackend::Mpi, {me, n});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the world has " + std::to_string(n) + " ranks"), std::string::npos)
        << e.what();
  }
}

TEST(CommunicatorMp, AllgatherBytesOfUnequalLengthsOnWorldAndSubTeams) {
  const int64_t n = comm().size(), me = comm().rank();
  auto bytesOf = [](int64_t r) {
    return "rank " + std::to_string(r) + std::string(static_cast<size_t>(r), '\0') + "!";
  };
  std::vector<int64_t> world(static_cast<size_t>(n));
  std::iota(world.begin(), world.end(), 0);
  auto all = comm().allgatherBytes(world, bytesOf(me), std::chrono::seconds(60));
  ASSERT_EQ(all.size(), static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) EXPECT_EQ(all[static_cast<size_t>(r)], bytesOf(r)) << "from rank " << r;

  // My parity's ranks, in descending order: results come in team order.
  std::vector<int64_t> team;
  for (int64_t r = n - 1; r >= 0; --r)
    if (r % 2 == me % 2) team.push_back(r);
  auto mine = comm().allgatherBytes(team, bytesOf(me), std::chrono::seconds(60));
  ASSERT_EQ(mine.size(), team.size());
  for (size_t i = 0; i < team.size(); ++i) EXPECT_EQ(mine[i], bytesOf(team[i])) << "from rank " << team[i];
}

TEST(CommunicatorMp, MpiCommOfATeamHasTheTeamsOrder) {
  const int64_t n = comm().size(), me = comm().rank();
  std::vector<int64_t> team;
  for (int64_t r = n - 1; r >= 0; --r) team.push_back(r);
  void* handle = comm().mpiCommFor(team);
  EXPECT_EQ(handle, comm().mpiCommFor(team));  // created once
  MPI_Comm c = mpi::fromHandle(handle);
  int rank = -1, size = -1;
  MPI_Comm_rank(c, &rank);
  MPI_Comm_size(c, &size);
  EXPECT_EQ(size, n);
  EXPECT_EQ(rank, n - 1 - me);
}

}  // namespace
}  // namespace meshfuse

// main() of the multi-process GoogleTest binary: every rank runs every test; the exit code is the
// worst over all ranks, so one failing rank fails the ctest entry.
#include <gtest/gtest.h>
#include <mpi.h>

#include "multidevice/communicator.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  meshfuse::Communicator& comm = meshfuse::Communicator::instance();
  // Only rank 0 prints the per-test progress; failures print on every rank.
  if (comm.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int local = RUN_ALL_TESTS();
  int worst = local;
  MPI_Allreduce(&local, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (local != 0) std::fprintf(stderr, "[rank %lld] tests FAILED\n", static_cast<long long>(comm.rank()));
  return worst;
}

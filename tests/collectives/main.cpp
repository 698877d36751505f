// Test main: under an MPI launcher (OMPI_COMM_WORLD_SIZE etc.) the tests run on the MPI backend,
// one rank per process (run_ranks uses the MPI world); otherwise on the sim backend.
#include <gtest/gtest.h>

#include <memory>

#include "support/ranks.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<nxd::mpi::Session> session;
  if (nxd::mpi::under_launcher() && nxd::mpi::available()) {
    session = std::make_unique<nxd::mpi::Session>(&argc, &argv);
    nxd::testing::mpi_session() = session.get();
  }
  int rc = RUN_ALL_TESTS();
  if (session) {
    // Every process must agree: a failure on any rank fails the job.
    int all = 0;
    nxd::world().all_reduce(&rc, &all, 1, nxd::DType::i32, nxd::ReduceOp::max);
    rc = all;
    nxd::testing::mpi_session() = nullptr;
  }
  return rc;
}

#pragma once
// The MPI backend's collective timeout (mpi::set_collective_timeout; docs/design/collectives.md,
// "MPI backend: hung ranks"). Internal to the backend: includes <mpi.h>.
//
// Without a timeout (the default) a wait is MPI_Waitall and blocking collectives stay blocking.
// With one, every wait of the backend (its collectives run in their nonblocking forms, the ring's
// and RDH's point-to-point messages, send/recv, Work::wait) polls MPI_Testall with a sleeping
// back-off (10 us doubling to 1 ms: the rank blocks, it does not spin) and answers other ranks'
// questions on a side channel (a duplicate of MPI_COMM_WORLD, tags of its own). Past the timeout
// the rank asks each member it waits for where it is; a member in a wait answers at once with
// its call, group and sequence number; members that stay silent for a grace period (a quarter of
// the timeout, 1 to 10 s) never arrived (hung, stopped, cut off). The rank prints the call, its
// group and sequence number, the silent ranks and where the others wait, and aborts the job
// (MPI_Abort, exit code 1), so a supervisor (nxd-elastic) restarts it. A call that completes
// during the grace period was only slow: the wait returns normally.
#include <mpi.h>

#include <cstdint>
#include <vector>

namespace nxd::mpi::detail {

// What a rank waits in: the call, its group (world ranks), this rank's place in it, the group's
// collective sequence number (the same on every member for the same call) and, for send/recv,
// the peer (its place in the group; -1: every other member).
struct Waiting {
  const char* op = "";
  std::vector<int> group;
  int rank = 0;
  int64_t seq = 0;
  int peer = -1;
};

// The side channel: MPI_Comm_dup of the world after MPI_Init (collective), freed before
// MPI_Finalize.
void watch_start();
void watch_stop();
// A timeout is set (mpi::collective_timeout() > 0).
bool timed();
// Completes the n requests (MPI's error code otherwise). With a timeout, as described above; past
// it and the grace period the job is aborted and this does not return.
int wait_all(int n, MPI_Request* reqs, const Waiting& w,
             MPI_Status* statuses = MPI_STATUSES_IGNORE);

}  // namespace nxd::mpi::detail

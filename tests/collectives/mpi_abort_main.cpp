// Run under mpirun: one rank fails while the others wait in a collective. The job must end with
// the failing rank's message (MPI_Abort) instead of hanging. Mode "run": the exception escapes
// mpi::run_or_abort; mode "terminate": it escapes main (the Session's terminate handler).
#include <chrono>
#include <cstring>
#include <thread>

#include "nxd/collectives/mpi/mpi.h"

int main(int argc, char** argv) {
  nxd::mpi::Session session(&argc, &argv);
  const bool terminate = argc > 1 && std::strcmp(argv[1], "terminate") == 0;
  auto body = [&] {
    nxd::Communicator& w = nxd::world();
    if (w.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      throw nxd::CommError("[my_step] boom on purpose");
    }
    w.barrier();  // the others would wait here forever
  };
  if (terminate)
    body();
  else
    nxd::mpi::run_or_abort(body);
  return 0;
}

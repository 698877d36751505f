#pragma once
// run_ranks(n, fn): runs fn on n ranks for a test. Normally that is sim::launch with n rank
// threads. A test binary started under mpirun sets mpi_session() (see
// tests/collectives/main.cpp); then fn runs on the first n processes, with a sub-communicator
// of them as their world, and run_ranks returns false on every process when n exceeds the MPI
// world (the caller skips that size). Results can be checked inside fn with gtest assertions.
#include <functional>
#include <memory>

#include "nxd/collectives/communicator.h"
#include "nxd/collectives/mpi/mpi.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/runtime/context.h"

namespace nxd::testing {

inline mpi::Session*& mpi_session() {
  static mpi::Session* s = nullptr;
  return s;
}
inline bool under_mpi() {
  return mpi_session() != nullptr;
}
// Largest rank count run_ranks can run: the MPI world, or `sim_max` on the sim backend.
inline int max_ranks(int sim_max = 8) {
  return under_mpi() ? mpi_session()->size() : sim_max;
}

inline bool run_ranks(int n, const std::function<void()>& fn, sim::LaunchOptions opts = {}) {
  if (!under_mpi()) {
    opts.world_size = n;
    sim::launch(opts, fn);
    return true;
  }
  mpi::Session& s = *mpi_session();
  if (n > s.size()) return false;
  Communicator& w = world();
  std::shared_ptr<Communicator> sub = w.split(w.rank() < n ? 0 : -1, w.rank());
  if (sub) {
    Context ctx(ContextOptions{.rank = sub->rank(), .world_size = n, .seed = opts.seed});
    set_world(ctx, sub);
    ContextGuard g(ctx);
    fn();
  }
  w.barrier();
  return true;
}

}  // namespace nxd::testing

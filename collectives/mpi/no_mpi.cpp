// The MPI entry points of a build without MPI (NXD_WITH_MPI=OFF): each throws ConfigError.
#include "nxd/collectives/mpi/mpi.h"

namespace nxd::mpi {

namespace {
[[noreturn]] void no_mpi() {
  throw ConfigError(
      "[mpi] nxd was built without MPI (NXD_WITH_MPI=OFF or MPI not found); use the sim backend "
      "or install libopenmpi-dev and rebuild");
}
}  // namespace

Session::Session(int*, char***, uint64_t) {
  no_mpi();
}
Session::~Session() = default;
int run_or_abort(const std::function<void()>&) {
  no_mpi();
}

}  // namespace nxd::mpi

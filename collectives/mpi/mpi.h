#pragma once
// The MPI backend: one rank per process, run under mpirun/mpiexec (one machine or many with a
// hostfile). Collectives map to MPI's own (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block,
// MPI_Bcast, MPI_Reduce, MPI_Alltoall, MPI_Send/MPI_Recv) and their non-blocking forms for the
// async calls; sub-groups use MPI_Comm_split; bf16 is a custom datatype with user reduction ops
// (each step adds in f32 and rounds). MPI errors are returned (MPI_ERRORS_RETURN) and thrown as
// CommError naming the operation, the group and the rank. Built when NXD_WITH_MPI; otherwise
// every entry point throws ConfigError.
#include <functional>
#include <memory>

#include "nxd/collectives/communicator.h"
#include "nxd/runtime/context.h"

namespace nxd::mpi {

// True when nxd was built with MPI.
bool available();
// True when this process was started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
// PMIX_RANK is set).
bool under_launcher();

// Initializes MPI (MPI_Init_thread, FUNNELED) and makes a Context for this process's rank, with
// the MPI world as its world communicator, current on the constructing thread. An uncaught
// exception anywhere afterwards aborts the whole job (MPI_Abort) after printing its message,
// instead of leaving the other ranks hanging. Finalizes MPI on destruction. One per process.
class Session {
 public:
  explicit Session(int* argc = nullptr, char*** argv = nullptr, uint64_t seed = 0);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  Context& context() { return *ctx_; }
  int rank() const { return ctx_->rank(); }
  int size() const { return ctx_->world_size(); }

 private:
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<ContextGuard> guard_;
};

// Runs fn; an exception escaping it prints "[nxd] rank r: <message>" and aborts the job with
// MPI_Abort. Returns 0 (for main()).
int run_or_abort(const std::function<void()>& fn);

}  // namespace nxd::mpi

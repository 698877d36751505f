#pragma once
// The MPI backend: one rank per process, run under mpirun/mpiexec (one machine or many with a
// hostfile). Collectives map to MPI's own (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block,
// MPI_Bcast, MPI_Reduce, MPI_Alltoall, MPI_Send/MPI_Recv) and their non-blocking forms for the
// async calls; sub-groups use MPI_Comm_split; bf16 is a custom datatype with user reduction ops
// (each step adds in f32 and rounds). Large all_reduce and reduce_scatter (all_gather when forced)
// run nxd's own pipelined ring over MPI_Isend/MPI_Irecv instead (mpi/ring.h; see Tuning). MPI
// errors are returned (MPI_ERRORS_RETURN) and thrown as CommError naming the operation, the group
// and the rank. Built when NXD_WITH_MPI; otherwise every entry point throws ConfigError.
#include <cstdint>
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

// How the MPI backend runs all_reduce, reduce_scatter and all_gather (and their non-blocking
// forms), process-wide. OpenMPI's own algorithms fall off a cliff from 32 MiB on a single host
// (a fresh buffer per call, page-faulted every time: docs/DESIGN.md, "MPI backend"); nxd's ring
// keeps a persistent scratch and does not. Session reads the environment; set_tuning overrides.
enum class Algorithm : uint8_t {
  automatic,  // NXD_MPI_ALGO=auto: by op and size (measured, docs/DESIGN.md "MPI backend"):
              // all_reduce on the ring from ring_min_bytes, reduce_scatter from
              // rs_ring_min_bytes, all_gather on MPI's own (it has no cliff)
  native,     // NXD_MPI_ALGO=mpi: always MPI_Allreduce / MPI_Reduce_scatter_block / ...
  ring,       // NXD_MPI_ALGO=ring: always the ring (groups of 2 or more)
};
struct Tuning {
  Algorithm algorithm = Algorithm::automatic;
  int64_t ring_min_bytes = int64_t{32} << 20;     // NXD_MPI_RING_MIN (bytes, K/M/G suffixes)
  int64_t rs_ring_min_bytes = int64_t{64} << 10;  // NXD_MPI_RS_RING_MIN
  int64_t chunk_bytes = int64_t{1} << 20;         // NXD_MPI_CHUNK: the ring's pipeline segment
  int depth = 4;                                  // NXD_MPI_DEPTH: segments received in flight
};
Tuning tuning();
void set_tuning(const Tuning& t);
// Tuning{} with NXD_MPI_ALGO, NXD_MPI_RING_MIN, NXD_MPI_RS_RING_MIN, NXD_MPI_CHUNK and
// NXD_MPI_DEPTH applied; throws
// ConfigError naming the variable and its value when one is malformed.
Tuning tuning_from_env();
// The algorithm used for a call on a group of `size` members moving `bytes` (the whole array:
// all_reduce's buffer, all_gather's output, reduce_scatter's input): "mpi" or "ring".
enum class Op : uint8_t { all_reduce, reduce_scatter, all_gather };
const char* algorithm_for(Op op, int64_t bytes, int size);

// Initializes MPI (MPI_Init_thread, FUNNELED) and makes a Context for this process's rank, with
// the MPI world as its world communicator, current on the constructing thread, and applies
// tuning_from_env(). An uncaught exception anywhere afterwards aborts the whole job (MPI_Abort)
// after printing its message, instead of leaving the other ranks hanging. Finalizes MPI on
// destruction. One per process.
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

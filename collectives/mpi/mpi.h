#pragma once
// The MPI backend: one rank per process, run under mpirun/mpiexec (one machine or many with a
// hostfile). Collectives map to MPI's own (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block,
// MPI_Bcast, MPI_Reduce, MPI_Alltoall, MPI_Send/MPI_Recv) and their non-blocking forms for the
// async calls; sub-groups use MPI_Comm_split; bf16 is a custom datatype with user reduction ops
// (each step adds in f32 and rounds). all_reduce, reduce_scatter and all_gather run nxd's own
// ring or recursive halving-doubling over MPI_Isend/MPI_Irecv where that measured faster (see
// Tuning; mpi/transport.h). MPI
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
// forms), process-wide: MPI's own collective, or one of nxd's point-to-point algorithms
// (algorithms/ring.h, rdh.h: the same code as on a Communicator, on MPI_Isend/MPI_Irecv over a
// duplicate of the group's communicator, with a persistent scratch). OpenMPI's own collectives
// fall off a cliff at large sizes on one host and its reduce-scatter is slow at every size
// (docs/design/collectives.md, "MPI backend"). Session reads the environment; set_tuning overrides.
enum class Algorithm : uint8_t {
  automatic,  // NXD_MPI_ALGO=auto: by op, size and group (thresholds below, measured in
              // docs/design/collectives.md "MPI backend")
  native,     // NXD_MPI_ALGO=mpi: always MPI_Allreduce / MPI_Reduce_scatter_block / ...
  ring,       // NXD_MPI_ALGO=ring: always the pipelined ring (groups of 2 or more)
  rdh,        // NXD_MPI_ALGO=rdh: always recursive halving-doubling where it exists (all_reduce
              // on any group, reduce_scatter and all_gather on power-of-two groups), else the ring
};
struct Tuning {
  Algorithm algorithm = Algorithm::automatic;
  // Algorithm::automatic by the bytes a call moves (the whole array: all_reduce's buffer,
  // all_gather's output, reduce_scatter's input; byte values take K/M/G suffixes):
  int64_t rdh_min_bytes = int64_t{32} << 20;      // NXD_MPI_RDH_MIN: all_reduce on RDH from here,
  int64_t ring_min_bytes = int64_t{32} << 20;     // NXD_MPI_RING_MIN: on the ring from here
  int64_t rs_ring_min_bytes = int64_t{64} << 10;  // NXD_MPI_RS_RING_MIN: reduce_scatter's ring
  int64_t ag_ring_min_bytes = int64_t{1} << 62;   // NXD_MPI_AG_RING_MIN: all_gather's ring
  int64_t chunk_bytes = int64_t{1} << 20;         // NXD_MPI_CHUNK: the ring's pipeline segment
  int depth = 4;                                  // NXD_MPI_DEPTH: segments received in flight
};
Tuning tuning();
void set_tuning(const Tuning& t);
// Tuning{} with NXD_MPI_ALGO, NXD_MPI_RDH_MIN, NXD_MPI_RING_MIN, NXD_MPI_RS_RING_MIN,
// NXD_MPI_AG_RING_MIN, NXD_MPI_CHUNK and NXD_MPI_DEPTH applied; throws ConfigError naming the
// variable and its value when one is malformed.
Tuning tuning_from_env();
enum class Op : uint8_t { all_reduce, reduce_scatter, all_gather };
// The algorithm the current tuning runs for a call on a group of `size` members moving `bytes`
// (never automatic; native for groups of one), and its name as the bench prints it: "mpi",
// "ring" or "rdh".
Algorithm choose(Op op, int64_t bytes, int size);
const char* algorithm_name(Algorithm a);
const char* algorithm_for(Op op, int64_t bytes, int size);  // algorithm_name(choose(...))

// The collective timeout, process-wide (0, the default: none, and no cost). With a timeout, a
// rank that waits longer than `seconds` in any call of the MPI backend (a collective, the ring's
// messages, send/recv, Work::wait; not communicator creation) asks the ranks it waits for where
// they are over a side channel, prints the call, its group and sequence number and the ranks that
// never arrived, and aborts the job (MPI_Abort, exit code 1): mpi/watchdog.h. Waits poll with a
// sleeping back-off (at most 1 ms) instead of blocking in MPI. ConfigError outside [0, 1e6].
void set_collective_timeout(double seconds);
double collective_timeout();
// set_collective_timeout(NXD_MPI_TIMEOUT) when the variable is set (Session calls it); ConfigError
// naming it when malformed.
void set_collective_timeout_from_env();

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

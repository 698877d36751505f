#pragma once
// nxd's own pipelined ring over MPI_Isend/MPI_Irecv, used by the MPI backend for large
// all_reduce, reduce_scatter and all_gather (see mpi.h, Tuning). Internal to the backend:
// includes <mpi.h>.
//
// Each ring step's chunk is cut into segments of Tuning::chunk_bytes; up to Tuning::depth
// receives are in flight into a persistent scratch ring of segment buffers, each segment is
// reduced as soon as it arrives (received partial first, then this rank's values: the same order
// as algorithms/ring.h) and sent on to the next rank at once, so the steps overlap. No buffer is
// allocated per call (the scratch lives with the communicator), which is what keeps large calls
// off glibc's fresh mmap + page faults (docs/DESIGN.md, "MPI backend").
//
// Deterministic: each chunk is reduced by one rank in a fixed order, then copied, so every rank
// gets the same bits on every run. bf16 is widened to f32 (a persistent copy), reduced there and
// rounded once at the end, as on the sim backend and in algorithms/ring.h.
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "nxd/collectives/communicator.h"

namespace nxd::mpi::detail {

struct RingComm {
  MPI_Comm comm;  // a duplicate reserved for the ring's messages
  int rank = 0, size = 1;
  std::vector<char>* scratch;   // persistent, grown on demand
  std::vector<char>* partials;  // reduce_scatter's two partial chunks, persistent
  std::vector<char>* widened;   // bf16 calls' f32 copy, persistent
  int64_t chunk_bytes = 0;      // segment size
  int depth = 1;                // receives in flight
  const char* what = "";        // "group [..] rank r", for error messages
};

// recv[i] = op over members of send[i]; send == recv is in place.
void ring_all_reduce(const RingComm& rc, const void* send, void* recv, int64_t count, DType t,
                     ReduceOp op);
// recv[i] = op over members of send[rank*count + i]; recv must not overlap send except at
// send + rank*count (the in-place form).
void ring_reduce_scatter(const RingComm& rc, const void* send, void* recv, int64_t count, DType t,
                         ReduceOp op);
// recv[r*count + i] = send_r[i]; send may be recv + rank*count (in place).
void ring_all_gather(const RingComm& rc, const void* send, void* recv, int64_t count, DType t);

}  // namespace nxd::mpi::detail

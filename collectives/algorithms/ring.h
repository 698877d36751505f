#pragma once
// Ring algorithms over point-to-point messages, written once (ring_impl.h) for any Transport
// (transport.h): the MPI backend runs them on MPI_Isend/MPI_Irecv (mpi/mpi.h, Tuning), and the
// functions here run them on any Communicator's isend/irecv (on the sim backend: the tests and
// the sim clock's closed forms; the sim backend's own collectives are its shared-memory data
// phase). Member r sends to r+1 and receives from r-1.
//
//   ring_reduce_scatter  p-1 steps: at step s member r sends its partial of chunk r-1-s and
//                        reduces the partial of chunk r-2-s it receives into its own (received
//                        partial first, then its own values); after p-1 steps it holds chunk r.
//   ring_all_gather      p-1 steps: member r forwards the chunk it got in the previous step.
//   ring_all_reduce      reduce-scatter, then all-gather of the reduced chunks (2(p-1) steps,
//                        2(p-1)/p of the array sent per member: bandwidth-optimal). The array is
//                        cut into p chunks (chunk_range: uneven counts are fine).
// Each step's chunk may be cut into segments with several receives in flight (P2pOptions::
// pipeline), so the steps overlap; the result does not depend on it.
// Deterministic: each chunk is reduced once, in a fixed order, then copied, so every member gets
// the same bits on every run, in place or not. bf16 partial sums travel in f32 and are rounded
// once at the end. avg needs a floating dtype (InvalidArgument).
#include "nxd/collectives/algorithms/transport.h"

namespace nxd::algorithms {

// recv[i] = op over members of send[i], i < call.count.
void ring_all_reduce(Communicator& c, const Call& call, const P2pOptions& o = {});
// recv[i] = op over members of send[rank*count + i]; send holds size()*count elements.
void ring_reduce_scatter(Communicator& c, const Call& call, const P2pOptions& o = {});
// recv[r*count + i] = send_r[i]; recv holds size()*count elements.
void ring_all_gather(Communicator& c, const Call& call, const P2pOptions& o = {});

}  // namespace nxd::algorithms

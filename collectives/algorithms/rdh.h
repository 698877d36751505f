#pragma once
// Recursive halving-doubling (Rabenseifner; Thakur, Rabenseifner, Gropp 2005), written once
// (rdh_impl.h) for any Transport like the ring (ring.h): the MPI backend runs it on MPI
// point-to-point, the functions here on any Communicator. The array is cut into q contiguous
// chunks, q the largest power of two <= size() (chunk_range).
//
//   rdh_reduce_scatter  lg q steps: at the step of distance d (q/2, q/4, ..., 1) member r
//                       exchanges half of the chunks it still holds with member r ^ d, keeps
//                       the half of its bit (lower half when r & d == 0) and reduces the
//                       received partial into it; after lg q steps it holds chunk r reduced.
//   rdh_all_gather      lg q steps of distance 1, 2, ..., q/2: the held range doubles.
//   rdh_all_reduce      both (2 lg q steps, 2(q-1)/q of the array sent per member:
//                       bandwidth-optimal like the ring with lg p instead of p-1 latency terms).
//                       A group that is not a power of two first folds: among the first
//                       2(p-q) members each even one sends its array to the next odd one and
//                       waits, the q remaining members run the above, and the odd ones send the
//                       result back.
// Deterministic: every partial sum combines the lower-numbered members' partial first, each
// chunk's final value is computed by one member and then copied, so every member gets the same
// bits on every run. bf16 partial sums travel in f32 and are rounded once at the end. The
// modeled time on the sim backend is rdh_all_reduce_time (sim/collective_cost.h).
#include "nxd/collectives/algorithms/transport.h"

namespace nxd::algorithms {

// Any group size; call as ring_all_reduce.
void rdh_all_reduce(Communicator& c, const Call& call, const P2pOptions& o = {});
// Power-of-two groups (InvalidArgument otherwise); call as ring_reduce_scatter.
void rdh_reduce_scatter(Communicator& c, const Call& call, const P2pOptions& o = {});
// Power-of-two groups (InvalidArgument otherwise); call as ring_all_gather.
void rdh_all_gather(Communicator& c, const Call& call, const P2pOptions& o = {});

}  // namespace nxd::algorithms

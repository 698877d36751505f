#pragma once
// Recursive halving-doubling (Rabenseifner; Thakur, Rabenseifner, Gropp 2005), written once
// against point-to-point messages like algorithms/ring.h. The array is cut into q contiguous
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
#include "nxd/collectives/communicator.h"

namespace nxd::algorithms {

inline constexpr int kRdhTag = 0x7a12;

// In place on `buf` (count elements on every member); any group size.
void rdh_all_reduce(Communicator& c, void* buf, int64_t count, DType dtype, ReduceOp op,
                    int tag = kRdhTag);
// Power-of-two groups. `buf` holds the whole array of `count` elements; on return
// chunk_range(count, p, rank()) of it is reduced on every member (the rest is scratch).
void rdh_reduce_scatter(Communicator& c, void* buf, int64_t count, DType dtype, ReduceOp op,
                        int tag = kRdhTag);
// Power-of-two groups. Member r holds chunk_range(count, p, r) of `buf` on entry; on return every
// member holds the whole array.
void rdh_all_gather(Communicator& c, void* buf, int64_t count, DType dtype, int tag = kRdhTag);

}  // namespace nxd::algorithms

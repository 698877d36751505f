#pragma once
// Ring algorithms written once against point-to-point messages (any Communicator's isend/recv),
// so every backend can run them; the backends' own collectives stay the fast path. Rank r sends
// to r+1 and receives from r-1. The array is cut into size() contiguous chunks (uneven counts
// are fine: the first count % p chunks are one element longer).
//
//   ring_reduce_scatter  p-1 steps: at step s rank r sends its partial of chunk r-s and reduces
//                        the partial of chunk r-s-1 it receives into its own (received partial
//                        first, then its own values); after p-1 steps it holds chunk r+1 reduced.
//   ring_all_gather      p-1 steps: rank r forwards the chunk it got in the previous step.
//   ring_all_reduce      reduce-scatter, then all-gather of the reduced chunks (2(p-1) steps,
//                        2(p-1)/p of the array sent per rank: bandwidth-optimal).
// Deterministic: each chunk is reduced once, in a fixed order, then copied, so every rank gets
// the same bits on every run. bf16 partial sums travel in f32 and are rounded once at the end.
#include "nxd/collectives/communicator.h"

namespace nxd::algorithms {

inline constexpr int kRingTag = 0x7a11;

// In place on `buf` (count elements on every member).
void ring_all_reduce(Communicator& c, void* buf, int64_t count, DType dtype, ReduceOp op,
                     int tag = kRingTag);
// `buf` holds the whole array of `count` elements; on return chunk_range(count, p, (r+1)%p) of it
// is reduced on member r. Returns that chunk index.
int ring_reduce_scatter(Communicator& c, void* buf, int64_t count, DType dtype, ReduceOp op,
                        int tag = kRingTag);
// `buf` holds `count` elements; member r owns chunk `first_owned(r)` = (r + shift) % p of it on
// entry; on return every member has every chunk.
void ring_all_gather(Communicator& c, void* buf, int64_t count, DType dtype, int shift = 0,
                     int tag = kRingTag);

// [begin, end) of chunk k when `count` elements are cut into p chunks.
std::pair<int64_t, int64_t> chunk_range(int64_t count, int p, int k);

}  // namespace nxd::algorithms

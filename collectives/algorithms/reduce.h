#pragma once
// The reduction kernels shared by the backends (sim, MPI's ring, self) and the point-to-point
// algorithms (ring.h, rdh.h). communicator.h includes this header.
#include <cstdint>
#include <vector>

#include "nxd/runtime/dtype.h"

namespace nxd {

enum class ReduceOp : uint8_t;  // communicator.h

// Reduction kernel shared by the backends: dst[i] = op(srcs[0][i], ..., srcs[k-1][i]) in source
// order (bf16 accumulates in f32, rounds once; avg divides by `divisor`). dst may alias srcs[j].
void reduce_buffers(void* dst, const std::vector<const void*>& srcs, int64_t count, DType dtype,
                    ReduceOp op, int divisor);
// The same result written to each of `nd` destinations in one pass (L1-sized blocks: every
// source block is combined, then stored to every destination). A destination may alias a source
// at the same offsets.
void reduce_buffers_to(void* const* dsts, int nd, const void* const* srcs, int ns, int64_t count,
                       DType dtype, ReduceOp op, int divisor);

}  // namespace nxd

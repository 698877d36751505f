#pragma once
// The reduction kernels shared by the backends (sim, self) and the point-to-point algorithms
// (ring.h, rdh.h, which the MPI backend runs). communicator.h includes this header.
#include <cstdint>
#include <initializer_list>
#include <span>

#include "nxd/runtime/dtype.h"

namespace nxd {

enum class ReduceOp : uint8_t { sum, avg, max, min };

// How a call combines values: element type, op, and the divisor of avg (the group size).
struct ReduceSpec {
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int divisor = 1;
};

// dst[i] = op(srcs[0][i], ..., srcs[k-1][i]) in source order (bf16 accumulates in f32 and rounds
// once; avg divides by r.divisor). dst may alias a source at the same offsets.
void reduce_buffers(void* dst, std::initializer_list<const void*> srcs, int64_t count,
                    const ReduceSpec& r);
// The same result written to every destination in one pass (L1-sized blocks: every source block
// is combined, then stored to every destination). A destination may alias a source at the same
// offsets.
void reduce_buffers_to(std::span<void* const> dsts, std::span<const void* const> srcs,
                       int64_t count, const ReduceSpec& r);

}  // namespace nxd

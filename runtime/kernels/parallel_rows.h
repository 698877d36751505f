#pragma once
// Row loops of the kernels on nxd's compute pool (runtime/parallel.h, the pool the GEMM uses).
//
// for_rows splits independent items (rows, blocks of elements, heads) into contiguous ranges.
// Each item is computed by itself, never reduced across items, so the results do not depend on
// the split. for_chunks is the reduction form: [0, n) is cut into chunks whose size the caller
// fixes (never the thread count); each chunk writes its own partial and the caller combines the
// partials in chunk order, so a reduction is bitwise the same for any thread count.
//
// Loops whose work is below kParallelMinWork per part stay on the calling thread (a pool wake-up
// costs a few microseconds), as do loops inside a pool job (nested calls run serially).
#include <algorithm>
#include <cstdint>

#include "nxd/runtime/parallel.h"

namespace nxd::kernels {

// Rough element-operations a part needs to be worth a wake-up.
inline constexpr int64_t kParallelMinWork = 1 << 15;

// fn(begin, end) over [0, n) items of about `cost` element-operations each.
template <class F>
void for_rows(int64_t n, int64_t cost, F&& fn) {
  if (n <= 0) return;
  const int64_t grain = std::max<int64_t>(1, kParallelMinWork / std::max<int64_t>(cost, 1));
  if (n < 2 * grain || parallel::threads() == 1 || parallel::in_parallel_region()) {
    fn(int64_t{0}, n);
    return;
  }
  parallel::parallel_for(n, grain, [&](int64_t b, int64_t e) { fn(b, e); });
}

// fn(begin, end) over [0, n) elements in blocks of `block` (L1-sized; the last may be short),
// parallel over blocks; `cost` is per element.
template <class F>
void for_blocks(int64_t n, int64_t block, int64_t cost, F&& fn) {
  for_rows((n + block - 1) / block, block * cost, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) fn(b * block, std::min(n, (b + 1) * block));
  });
}

// Number of chunks of `chunk` items in [0, n).
inline int64_t num_chunks(int64_t n, int64_t chunk) {
  return (n + chunk - 1) / chunk;
}

// fn(c, begin, end) for every chunk c of `chunk` items of [0, n), parallel over chunks; `cost`
// is per item. The chunking depends on n and chunk only.
template <class F>
void for_chunks(int64_t n, int64_t chunk, int64_t cost, F&& fn) {
  for_rows(num_chunks(n, chunk), chunk * cost, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) fn(c, c * chunk, std::min(n, (c + 1) * chunk));
  });
}

}  // namespace nxd::kernels

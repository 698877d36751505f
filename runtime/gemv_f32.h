#pragma once
// Internal (runtime/blas.cpp): the f32 product of a few rows, C[m, n] = alpha * op(A) @ op(B) +
// beta * C with m <= kSmallRows. A decode step of a linear layer is this shape (one row per
// running sequence against the weight), and up to a serving batch it is bound by reading B once
// and by the multiply-adds: a general GEMM packs all of B on every call (at 16 rows Eigen spent
// half of a decode step packing), and splitting it by rows leaves a second thread idle. Here every
// element of C is one dot product over the whole K in a fixed order (lanes8::dot: 32 lanes,
// combined pairwise, then the tail), computed by one thread, in register tiles of a few rows by a
// few columns so that each load of B serves several rows; the columns of C are split over the
// compute pool. Results do not depend on the thread count, the split, the tile, the operands'
// addresses or m (a row's values are the same alone as in any batch).
#include <cstdint>

namespace nxd::blas::detail {

inline constexpr int64_t kSmallRows = 32;
// ... and B at least this many elements (256 KiB of f32: a weight read from memory, not a block
// of attention that sits in L2, which stays on the engine and its results).
inline constexpr int64_t kSmallRowsMinB = int64_t{1} << 16;

// Computes and returns true for m <= kSmallRows and n * k >= kSmallRowsMinB (any
// transposition); false (nothing done) otherwise. m, n, k > 0.
bool sgemm_small_rows(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc);

// One part of sgemm_small_rows for op(B) = B^T (B stored [n, k], ldb apart), on the calling
// thread: C[m, j0:j1] (ldc apart) with each element lanes8::dot of A's row (x: m contiguous rows
// of k) and B's row, as above. For kernels that hold a weight in another dtype and widen a block
// of its rows to f32 at a time (runtime/kernels/gemv_bf16.cpp). m <= kSmallRows.
void small_rows_times_bt(int64_t m, int64_t k, const float* x, int64_t j0, int64_t j1, float alpha,
                         const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace nxd::blas::detail

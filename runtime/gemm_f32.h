#pragma once
// Internal (runtime/blas.cpp): the f32 product on Eigen's GEBP kernel, whole or split over the
// compute pool without packing op(B) once per part.
//
// In Eigen's terms (a row-major C is computed as the column-major Cᵀ = op(B)ᵀ op(A)ᵀ) op(B) is the
// packed "lhs": a linear layer's weight. Eigen's own product packs it on every call, and a row
// split over n threads packed it n times, once per part, as much work as the product itself on a
// 64-token prefill chunk. Here a split product packs op(B) once, its panels shared out over the
// pool, then splits C by rows as before (every part a multiple of 16 rows but the last), each
// part packing only its own rows of op(A) and running Eigen's kernel on the shared packed op(B).
// Or, when C has more columns than rows, a split by columns in whole panels of op(B): each part
// packs only its share of op(B) and all of op(A), with no shared buffer and one fork per call.
// Either way an element of C is computed exactly as in Eigen's unsplit product: the same blocking
// of K (Eigen's kc, a function of k and the CPU's caches only), the same micro-kernel (fixed by the
// element's column among op(B)'s panels of mr rows, which parts and chunks start on, and its row
// among the groups of nr rows, which row parts start on), the
// K blocks added in order. So the bits equal Eigen's product of the whole, at any part count
// (tests/runtime/gemm_f32_test.cpp).
#include <cstddef>
#include <cstdint>

namespace nxd::blas::detail {

// The L1 data cache size Eigen's blocking plans with on every CPU (its kc, the K block of every
// f32 product, follows it): pinned in blas.cpp so one build gives the same bits on every CPU of
// its instruction set.
inline constexpr std::ptrdiff_t kEigenL1Bytes = 32 * 1024;

// Eigen's product C = alpha * op(A) @ op(B) + beta * C (row-major, explicit leading dimensions)
// on the calling thread, as Eigen's own expression evaluates it. k may be 0.
void sgemm_eigen(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Eigen's panel height for op(B) (gebp_traits<float, float>::mr): 48 on AVX-512, 24 on AVX2, 12 on
// SSE. A split by columns has parts of whole panels.
extern const int64_t kEigenMr;

enum class SplitBy {
  rows,     // parts of C's rows, op(B) packed once and shared (two forks per call)
  columns,  // parts of C's columns in whole panels of op(B), each part packing its own columns of
            // op(B) and all of op(A) (one fork per call)
};

struct EigenSplitOptions {
  int parts = 2;  // by rows: each but the last >= 16 rows; by columns: whole panels of mr columns
  SplitBy by = SplitBy::rows;
  // Most floats of op(B) packed at a time: a wider op(B) is done in chunks of columns (whole
  // panels of mr), each packed once. 4 Mi floats = 16 MiB.
  int64_t max_packed_floats = int64_t{1} << 22;
};

// The same product over the compute pool (parallel::run, so serially when called from a job).
// Needs m >= 16 (by rows, 16 * parts), n >= 2, k >= 1 and m + n + k >= 20 (Eigen's products
// below that are coefficient-based, and with m <= 4 Eigen may block op(B) off its panels);
// bitwise sgemm_eigen's result.
void sgemm_eigen_split(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                       float* c, int64_t ldc, const EigenSplitOptions& o);

}  // namespace nxd::blas::detail

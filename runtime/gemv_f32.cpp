#include "nxd/runtime/gemv_f32.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "nxd/runtime/kernels/parallel_rows.h"
#include "nxd/runtime/lanes8.h"

namespace nxd::blas::detail {

namespace {

using lanes8::dot;
using lanes8::load8;
using lanes8::store8;
using lanes8::V8;

inline void store(float* c, float v, float alpha, float beta) {
  *c = beta == 0.0f ? alpha * v : alpha * v + beta * *c;
}

// C[m, j0:j1] for B stored [n, k] (op(B) = B^T, the weight of a linear layer): dot products of
// contiguous rows. Each row of B is read once for all m rows of A.
void rows_times_bt(int64_t m, int64_t k, const float* x, int64_t j0, int64_t j1, float alpha,
                   const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t j = j0; j < j1; ++j) {
    const float* w = b + j * ldb;
    for (int64_t i = 0; i < m; ++i) store(c + i * ldc + j, dot(x + i * k, w, k), alpha, beta);
  }
}

// C[m, j0:j1] for B stored [k, n] (op(B) = B): each element accumulates over k in order, the
// columns 8 lanes at a time, in blocks that keep the m accumulator rows in L1.
void rows_times_b(int64_t m, int64_t k, const float* x, int64_t j0, int64_t j1, float alpha,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  constexpr int64_t kBlock = 256;
  alignas(32) float acc[kSmallRows * kBlock];
  for (int64_t jb = j0; jb < j1; jb += kBlock) {
    const int64_t w = std::min(kBlock, j1 - jb), w8 = w / 8 * 8;
    std::fill(acc, acc + m * kBlock, 0.0f);
    for (int64_t kk = 0; kk < k; ++kk) {
      const float* brow = b + kk * ldb + jb;
      for (int64_t i = 0; i < m; ++i) {
        const float xv = x[i * k + kk];
        const V8 xs = {xv, xv, xv, xv, xv, xv, xv, xv};
        float* ar = acc + i * kBlock;
        for (int64_t j = 0; j < w8; j += 8) store8(ar + j, load8(ar + j) + xs * load8(brow + j));
        for (int64_t j = w8; j < w; ++j) ar[j] += xv * brow[j];
      }
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < w; ++j) store(c + i * ldc + jb + j, acc[i * kBlock + j], alpha, beta);
  }
}

}  // namespace

bool sgemm_small_rows(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) {
  if (m > kSmallRows || n * k < kSmallRowsMinB) return false;
  // The rows of op(A), contiguous (a copy of m * k values; in place when they already are).
  const float* x = a;
  thread_local std::vector<float> xs;
  if (ta || (m > 1 && lda != k)) {
    if (static_cast<int64_t>(xs.size()) < m * k) xs.resize(static_cast<size_t>(m * k));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t kk = 0; kk < k; ++kk) xs[i * k + kk] = ta ? a[kk * lda + i] : a[i * lda + kk];
    x = xs.data();
  }
  // Columns of C are independent: split them over the pool (at least 8 per part).
  kernels::for_rows((n + 7) / 8, 16 * m * k, [&](int64_t q0, int64_t q1) {
    const int64_t j0 = 8 * q0, j1 = std::min(n, 8 * q1);
    if (tb)
      rows_times_bt(m, k, x, j0, j1, alpha, b, ldb, beta, c, ldc);
    else
      rows_times_b(m, k, x, j0, j1, alpha, b, ldb, beta, c, ldc);
  });
  return true;
}

}  // namespace nxd::blas::detail

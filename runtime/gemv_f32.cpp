#include "nxd/runtime/gemv_f32.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "nxd/runtime/kernels/parallel_rows.h"
#include "nxd/runtime/lanes8.h"

namespace nxd::blas::detail {

namespace {

using lanes8::load8;
using lanes8::store8;
using lanes8::V8;

inline void store(float* c, float v, float alpha, float beta) {
  *c = beta == 0.0f ? alpha * v : alpha * v + beta * *c;
}

// Sixteen f32 lanes: two of lanes8's registers side by side (one AVX-512 register, two AVX ones,
// four SSE ones). Lane l of the pair's low half is lanes8::dot's register s0 or s2, of its high
// half s1 or s3, so the arithmetic of every lane is dot's.
typedef float V16 __attribute__((vector_size(64)));

// (Into a reference: a V16 returned by value would change the ABI between the builds' instruction
// sets, which GCC warns about on all but AVX-512; the function is internal and inlined anyway.)
inline void load16(V16& v, const float* p) {
  std::memcpy(&v, p, sizeof v);
}
inline V8 half(const V16& v, int h) {
  V8 r;
  std::memcpy(&r, reinterpret_cast<const char*>(&v) + 32 * h, sizeof r);
  return r;
}

// An empty asm that takes v in a register and gives it back unchanged: the compiler can no longer
// fold the load into each product (a memory operand per use). Only where a V16 is one register.
inline void keep_in_register([[maybe_unused]] V16& v) {
#if defined(__AVX512F__)
  asm("" : "+v"(v));
#endif
}

// The tile of R rows of x (contiguous, k apart) by C rows of B (ldb apart): out[r * C + c] =
// dot(x_r, b_c, k), bitwise lanes8::dot, with each of the tile's B and x loads used C or R times.
// The 32-lane accumulators of each (r, c) are two V16 (lo: lanes 0-15, hi: 16-31), so the tile
// is R * C * 2 registers: sized per instruction set below, which changes no value.
// `ahead` (C rows, ldb apart) is prefetched along: the next tile's rows of B.
template <int R, int C>
inline void dot_tile(const float* __restrict x, int64_t k, const float* __restrict b, int64_t ldb,
                     const float* ahead, float* out) {
  V16 lo[R][C] = {}, hi[R][C] = {};
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      __builtin_prefetch(ahead + c * ldb + i);
      __builtin_prefetch(ahead + c * ldb + i + 16);
    }
    V16 wl[C], wh[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      load16(wl[c], b + c * ldb + i);
      load16(wh[c], b + c * ldb + i + 16);
      // held in registers (as x below): GCC would otherwise load them again for every product
      // and the loads, not the multiply-adds, would bound the tile (an empty asm changes no value)
      keep_in_register(wl[c]);
      keep_in_register(wh[c]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      V16 xl, xh;
      load16(xl, x + r * k + i);
      load16(xh, x + r * k + i + 16);
      keep_in_register(xl);
      keep_in_register(xh);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        lo[r][c] += xl * wl[c];
        hi[r][c] += xh * wh[c];
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {  // dot's epilogue on (s0, s1, s2, s3)
      const float* xr = x + r * k;
      const float* w = b + c * ldb;
      V8 s0 = half(lo[r][c], 0);
      int64_t t = i;
      for (; t + 8 <= k; t += 8) s0 += load8(xr + t) * load8(w + t);
      const V8 s = (s0 + half(lo[r][c], 1)) + (half(hi[r][c], 0) + half(hi[r][c], 1));
      float v = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
      for (; t < k; ++t) v += xr[t] * w[t];
      out[r * C + c] = v;
    }
}

// The tile shape per instruction set: its accumulators and loads fit the register file (32
// AVX-512 registers; 16 AVX2 ones, two per V16; 16 SSE ones, four per V16).
#if defined(__AVX512F__)
constexpr int kTileRows = 4, kTileCols = 2;
#elif defined(__AVX__)
constexpr int kTileRows = 2, kTileCols = 1;
#else
constexpr int kTileRows = 1, kTileCols = 1;
#endif

static_assert(kTileRows >= 1 && kTileRows <= 4 && kTileCols >= 1);

// `rows` (1..kTileRows) rows of x against C rows of B: dot_tile with R = rows.
template <int C>
void tile_rows(int64_t rows, int64_t k, const float* x, const float* b, int64_t ldb,
               const float* ahead, float* out) {
  if (rows == 1) return dot_tile<1, C>(x, k, b, ldb, ahead, out);
  if constexpr (kTileRows >= 2)
    if (rows == 2) return dot_tile<2, C>(x, k, b, ldb, ahead, out);
  if constexpr (kTileRows >= 3)
    if (rows == 3) return dot_tile<3, C>(x, k, b, ldb, ahead, out);
  if constexpr (kTileRows >= 4) return dot_tile<4, C>(x, k, b, ldb, ahead, out);
}

// C[m, j0:j1] for B stored [n, k] (op(B) = B^T, the weight of a linear layer): dot products of
// contiguous rows, in tiles of kTileRows rows of A by kTileCols rows of B. A tile's rows of B are
// read from memory once and then from L1 for the other tiles of rows; every element is
// lanes8::dot of its row and column whatever m and the tile.
void rows_times_bt(int64_t m, int64_t k, const float* x, int64_t j0, int64_t j1, float alpha,
                   const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  float out[kTileRows * kTileCols];
  for (int64_t j = j0; j < j1; j += kTileCols) {
    const int64_t cols = std::min<int64_t>(kTileCols, j1 - j);
    for (int64_t i = 0; i < m; i += kTileRows) {
      const int64_t rows = std::min<int64_t>(kTileRows, m - i);
      const float* xi = x + i * k;
      // the first tile of rows, which reads this tile's B from memory, also prefetches the next
      // tile's (only the cache sees it; the others re-read this tile's rows from L1)
      const float* ahead =
          i == 0 && j + 2 * kTileCols <= j1 ? b + (j + kTileCols) * ldb : b + j * ldb;
      if (cols == kTileCols)
        tile_rows<kTileCols>(rows, k, xi, b + j * ldb, ldb, ahead, out);
      else
        for (int64_t q = 0; q < cols; ++q) {
          float one[kTileRows];
          tile_rows<1>(rows, k, xi, b + (j + q) * ldb, ldb, b + (j + q) * ldb, one);
          for (int64_t r = 0; r < rows; ++r) out[r * kTileCols + q] = one[r];
        }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t q = 0; q < cols; ++q)
          store(c + (i + r) * ldc + j + q, out[r * kTileCols + q], alpha, beta);
    }
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

void small_rows_times_bt(int64_t m, int64_t k, const float* x, int64_t j0, int64_t j1, float alpha,
                         const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  rows_times_bt(m, k, x, j0, j1, alpha, b, ldb, beta, c, ldc);
}

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

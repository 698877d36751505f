// The int8_blocks product of a 4-bit weight (runtime/kernels/gemv_int4.h: Int4Activations): the
// activations quantized per 32-input block to int8 (Q8_0), exact integer block dot products with
// the weights' codes, then a fixed order of f32 scalings and sums.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "nxd/runtime/kernels/gemv_int4.h"
#include "nxd/runtime/kernels/parallel_rows.h"
#include "nxd/runtime/lanes8.h"

namespace nxd::kernels {

namespace {

using lanes8::V8;
using I32x8 = lanes8::I32x8;
typedef uint8_t U8x32 __attribute__((vector_size(32)));
typedef uint8_t U8x16 __attribute__((vector_size(16)));

// A row's quantized activations: codes (32 per block, the padding 0), scales, per block the
// offset term -8 * sum q (symmetric), per group the f32 sum of x in input order (asymmetric).
struct Activations {
  int64_t blocks = 0, groups = 0;
  std::vector<int8_t> q;
  std::vector<float> d, xsum;
  std::vector<int32_t> off;
};

// Block b's 32 codes u (0..15) in input order: the low nibbles of its 16 bytes, then the high.
// AVX2: the 16 bytes broadcast to both halves (a load), both nibbles masked and the halves
// blended (no shuffle); else the two halves concatenated in registers (a concatenation through
// memory stalls on store forwarding).
inline U8x32 unpack(const uint8_t* b) {
#if defined(__AVX2__)
  const __m256i w =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
  const __m256i m = _mm256_set1_epi8(15);
  return (U8x32)_mm256_blend_epi32(_mm256_and_si256(w, m),
                                   _mm256_and_si256(_mm256_srli_epi16(w, 4), m), 0xF0);
#else
  U8x16 v;
  std::memcpy(&v, b, 16);
  const U8x16 lo = v & 15, hi = v >> 4;
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
#endif
}

// Lane c: sum over the block's 32 inputs of w[c][j] * xq[j] for 8 weight blocks (8 columns),
// exact in int32 (|sum| <= 32 * 15 * 127). The order of integer additions does not matter.
inline I32x8 block_sums8(const U8x32* w, const int8_t* xq) {
#if defined(__AVX2__)
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  __m256i v[8];
  for (int c = 0; c < 8; ++c) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    v[c] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), (__m256i)w[c], xv);
#elif defined(__AVXVNNI__)
    v[c] = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), (__m256i)w[c], xv);
#else
    // pairs of u8 x s8 products in int16 (at most 2 * 15 * 127: no saturation), then pairs of those
    v[c] = _mm256_madd_epi16(_mm256_maddubs_epi16((__m256i)w[c], xv), _mm256_set1_epi16(1));
#endif
  }
  // the 8 vectors' lane sums, lane c for vector c
  const __m256i a01 = _mm256_hadd_epi32(v[0], v[1]), a23 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i a45 = _mm256_hadd_epi32(v[4], v[5]), a67 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i b0 = _mm256_hadd_epi32(a01, a23), b1 = _mm256_hadd_epi32(a45, a67);
  return (I32x8)_mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20),
                                 _mm256_permute2x128_si256(b0, b1, 0x31));
#elif defined(__SSSE3__)
  __m128i x0, x1;
  std::memcpy(&x0, xq, 16);
  std::memcpy(&x1, xq + 16, 16);
  I32x8 r;
  for (int c = 0; c < 8; ++c) {
    __m128i w0, w1;
    std::memcpy(&w0, &w[c], 16);
    std::memcpy(&w1, reinterpret_cast<const char*>(&w[c]) + 16, 16);
    const __m128i one = _mm_set1_epi16(1);
    __m128i p = _mm_add_epi32(_mm_madd_epi16(_mm_maddubs_epi16(w0, x0), one),
                              _mm_madd_epi16(_mm_maddubs_epi16(w1, x1), one));
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0x4E));
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0xB1));
    r[c] = _mm_cvtsi128_si32(p);
  }
  return r;
#else
  I32x8 r;
  for (int c = 0; c < 8; ++c) {
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += int32_t{w[c][j]} * int32_t{xq[j]};
    r[c] = s;
  }
  return r;
#endif
}

inline V8 splat(float v) {
  return V8{v, v, v, v, v, v, v, v};
}

Activations quantize_rows(const float* x, const Int4Layout& l, int64_t m) {
  Activations a;
  a.blocks = l.blocks_per_row(), a.groups = l.groups_per_row();
  a.q.resize(static_cast<size_t>(m * a.blocks * 32));
  a.d.resize(static_cast<size_t>(m * a.blocks));
  for (int64_t i = 0; i < m; ++i)
    quantize_int4_activations(a.q.data() + i * a.blocks * 32, a.d.data() + i * a.blocks,
                              x + i * l.k, l.k);
  if (l.zero == Int4Zero::symmetric) {
    a.off.resize(static_cast<size_t>(m * a.blocks));
    for (size_t b = 0; b < a.off.size(); ++b) {
      int32_t s = 0;
      for (int e = 0; e < 32; ++e) s += a.q[32 * b + e];
      a.off[b] = -8 * s;
    }
  } else {  // the f32 sum of x over each group, in input order (gemv_int4's)
    a.xsum.assign(static_cast<size_t>(m * a.groups), 0.0f);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < l.k; ++j) a.xsum[i * a.groups + j / l.group] += x[i * l.k + j];
  }
  return a;
}

// r[c][e] -> r[e][c] for an 8 x 8 block of f32 (unpack, then 64-bit, then 128-bit interleaves).
inline void transpose8(V8* r) {
  V8 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = __builtin_shufflevector(r[2 * i], r[2 * i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[2 * i + 1] = __builtin_shufflevector(r[2 * i], r[2 * i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = __builtin_shufflevector(t[4 * i], t[4 * i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[4 * i + 1] = __builtin_shufflevector(t[4 * i], t[4 * i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[4 * i + 2] = __builtin_shufflevector(t[4 * i + 1], t[4 * i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[4 * i + 3] = __builtin_shufflevector(t[4 * i + 1], t[4 * i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = __builtin_shufflevector(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    r[i + 4] = __builtin_shufflevector(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

// t[8 g + c] = v[cols[c] * G + g]: the 8 columns' per-group values, a register per group.
void interleave8(float* t, const float* v, const int64_t* cols, int64_t G) {
  int64_t g = 0;
  for (; g + 8 <= G; g += 8) {
    V8 r[8];
    for (int c = 0; c < 8; ++c) r[c] = lanes8::load8(v + cols[c] * G + g);
    transpose8(r);
    for (int e = 0; e < 8; ++e) lanes8::store8(t + 8 * (g + e), r[e]);
  }
  for (; g < G; ++g)
    for (int c = 0; c < 8; ++c) t[8 * g + c] = v[cols[c] * G + g];
}

// The 8 columns c0 .. c0 + 7 (the ones past l.n repeat the last, and are not written) for rows
// [i0, i0 + m) (m <= kRows, a compile-time 1 for decode so that its sums stay in registers): each
// column one f32 lane. Each group's weight blocks are unpacked once for the m rows; per row and
// block the 8 columns' exact sums are scaled in one register. kBlocks: blocks per whole group.
template <Int4Zero Z, int kBlocks, int kRows>
void tile_q8(float* c, const Activations& a, const uint8_t* q, const float* scale, const float* min,
             const Int4Layout& l, int64_t i0, int64_t m, int64_t c0) {
  constexpr bool sym = Z == Int4Zero::symmetric;
  const int64_t n = l.n, nb = a.blocks, G = a.groups, bpr = l.bytes_per_row();
  const int64_t rows = kRows == 1 ? 1 : m;
  int64_t cols[8];
  const uint8_t* qc[8];
  for (int cc = 0; cc < 8; ++cc) cols[cc] = std::min(c0 + cc, n - 1), qc[cc] = q + cols[cc] * bpr;
  V8 lanes[kRows] = {}, acc[kRows] = {};
  // the tile's scales (and minimums) group by group, 8 columns each: one load per group
  thread_local std::vector<float> tsc, tmn;
  if (static_cast<int64_t>(tsc.size()) < 8 * G) tsc.resize(static_cast<size_t>(8 * G));
  interleave8(tsc.data(), scale, cols, G);
  if constexpr (!sym) {
    if (static_cast<int64_t>(tmn.size()) < 8 * G) tmn.resize(static_cast<size_t>(8 * G));
    interleave8(tmn.data(), min, cols, G);
  }
  // The 8 rows' bytes are read 16 at a time from 8 places, which the hardware prefetchers do not
  // follow; the next tile's rows (contiguous, 8 * bpr bytes) and scales are fetched meanwhile.
  const char* next = reinterpret_cast<const char*>(q + std::min(c0 + 8, n) * bpr);
  const char* end = reinterpret_cast<const char*>(q + n * bpr);
  const char* next_sc = reinterpret_cast<const char*>(scale + std::min(c0 + 8, n) * G);
  for (int64_t p = 0; p < 32 * G && next_sc + p < reinterpret_cast<const char*>(scale + n * G);
       p += 64)
    __builtin_prefetch(next_sc + p);
  const int8_t* aq = a.q.data();
  const float* ad = a.d.data();
  const int32_t* aoff = a.off.data();
  const float* axs = a.xsum.data();
  auto group = [&](int64_t g, int64_t blocks) {
    const int64_t b0 = g * kBlocks;
    for (int64_t p = 128 * kBlocks * g; p < 128 * kBlocks * (g + 1); p += 64)
      if (next + p < end) __builtin_prefetch(next + p);
    U8x32 w[kBlocks][8];
    for (int64_t t = 0; t < blocks; ++t)
      for (int cc = 0; cc < 8; ++cc) w[t][cc] = unpack(qc[cc] + 16 * (b0 + t));
    const V8 sc = lanes8::load8(tsc.data() + 8 * g);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t rb = (i0 + i) * nb + b0;  // the row's first block of the group
      V8 gsum;
      for (int64_t t = 0; t < blocks; ++t) {
        I32x8 s = block_sums8(w[t], aq + 32 * (rb + t));
        if constexpr (sym) s += aoff[rb + t];
        const V8 f = __builtin_convertvector(s, V8) * splat(ad[rb + t]);
        gsum = t == 0 ? f : gsum + f;
      }
      lanes[i] += gsum * sc;
      if constexpr (!sym) acc[i] += lanes8::load8(tmn.data() + 8 * g) * axs[(i0 + i) * G + g];
    }
  };
  const int64_t whole = nb / kBlocks;  // groups of kBlocks blocks; a last short one after
  for (int64_t g = 0; g < whole; ++g) group(g, kBlocks);
  if (whole < G) group(whole, nb - whole * kBlocks);
  for (int64_t i = 0; i < rows; ++i) {
    const V8 out = sym ? lanes[i] : acc[i] + lanes[i];
    for (int cc = 0; cc < 8 && c0 + cc < n; ++cc) c[i * n + c0 + cc] = out[cc];
  }
}

template <Int4Zero Z, int kBlocks>
void tile_q8_rows(float* c, const Activations& a, const uint8_t* q, const float* scale,
                  const float* min, const Int4Layout& l, int64_t i0, int64_t m, int64_t c0) {
  if (m == 1)
    tile_q8<Z, kBlocks, 1>(c, a, q, scale, min, l, i0, m, c0);
  else
    tile_q8<Z, kBlocks, kInt4GemvMaxRows>(c, a, q, scale, min, l, i0, m, c0);
}

template <Int4Zero Z>
void tile_q8_of(float* c, const Activations& a, const uint8_t* q, const float* scale,
                const float* min, const Int4Layout& l, int64_t i0, int64_t m, int64_t c0) {
  switch (l.group) {
    case 32:
      return tile_q8_rows<Z, 1>(c, a, q, scale, min, l, i0, m, c0);
    case 64:
      return tile_q8_rows<Z, 2>(c, a, q, scale, min, l, i0, m, c0);
    default:
      return tile_q8_rows<Z, 4>(c, a, q, scale, min, l, i0, m, c0);
  }
}

}  // namespace

void quantize_int4_activations(int8_t* q, float* d, const float* x, int64_t k) {
  const int64_t nb = (k + 31) / 32;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t j0 = 32 * b, j1 = std::min(k, j0 + 32);
    float amax = 0.0f;
    bool finite = true;
    for (int64_t j = j0; j < j1; ++j) {
      finite = finite && std::isfinite(x[j]);
      amax = std::max(amax, std::abs(x[j]));
    }
    int8_t* qb = q + j0;
    std::fill(qb, qb + 32, int8_t{0});
    if (!finite) {
      d[b] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float db = amax / 127.0f;
    d[b] = db;
    if (db == 0.0f) continue;
    for (int64_t j = j0; j < j1; ++j)
      qb[j - j0] = static_cast<int8_t>(std::clamp(std::nearbyint(x[j] / db), -127.0f, 127.0f));
  }
}

void gemv_int4_q8(float* c, const float* x, const uint8_t* q, const float* scale, const float* min,
                  const Int4Layout& l, int64_t m) {
  l.check("gemv_int4_q8");
  if (m <= 0) return;
  const Activations a = quantize_rows(x, l, m);
  const bool asym = l.zero == Int4Zero::asymmetric;
  for (int64_t i0 = 0; i0 < m; i0 += kInt4GemvMaxRows) {
    const int64_t mi = std::min(kInt4GemvMaxRows, m - i0);
    float* ci = c + i0 * l.n;
    for_rows((l.n + 7) / 8, 8 * mi * l.k, [&](int64_t q0, int64_t q1) {
      for (int64_t t = q0; t < q1; ++t)
        if (asym)
          tile_q8_of<Int4Zero::asymmetric>(ci, a, q, scale, min, l, i0, mi, 8 * t);
        else
          tile_q8_of<Int4Zero::symmetric>(ci, a, q, scale, min, l, i0, mi, 8 * t);
    });
  }
}

}  // namespace nxd::kernels

#include "nxd/runtime/kernels/gemv_int4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/kernels/dequantized_blocks.h"
#include "nxd/runtime/kernels/parallel_rows.h"
#include "nxd/runtime/lanes8.h"

namespace nxd::kernels {

namespace {

using lanes8::load8;
using lanes8::V8;

// The 4-bit value of input j of a row.
inline int nibble(const uint8_t* row, int64_t j) {
  const uint8_t b = row[16 * (j / 32) + (j % 16)];
  return (j % 32) < 16 ? (b & 15) : (b >> 4);
}

// u - off as f32 for the 4-bit codes in the low 4 bits of each lane (the bits above are ignored
// when kMasked is false: they must be zero). With AVX-512VL one two-table permute (vpermt2ps)
// looks the 16 values up, else the lanes are masked, the offset subtracted in int32 and the
// result converted; the values are exact either way, so every build gets the same bits.
template <Int4Zero Z, bool kMasked>
inline V8 code_values(lanes8::I32x8 u) {
  constexpr float o = Z == Int4Zero::symmetric ? 8.0f : 0.0f;
#if defined(__AVX512VL__)
  const __m256 t0 = _mm256_setr_ps(0 - o, 1 - o, 2 - o, 3 - o, 4 - o, 5 - o, 6 - o, 7 - o);
  const __m256 t1 = _mm256_setr_ps(8 - o, 9 - o, 10 - o, 11 - o, 12 - o, 13 - o, 14 - o, 15 - o);
  return (V8)_mm256_permutex2var_ps(t0, (__m256i)u, t1);
#else
  if constexpr (kMasked) u &= 15;
  if constexpr (Z == Int4Zero::symmetric) u -= 8;
  return __builtin_convertvector(u, V8);
#endif
}

// One whole 32-input block's values u - off as f32, four registers: inputs 0-7, 8-15 (the low
// nibbles of bytes 0-7, 8-15), 16-23, 24-31 (their high nibbles). Each 8 bytes are widened to
// int32 once (lanes8::widen8) and both nibbles taken from the same lanes.
struct Block {
  V8 w[4];
};
template <Int4Zero Z>
inline Block block_values(const uint8_t* b) {
  const lanes8::I32x8 a = lanes8::widen8(b), c = lanes8::widen8(b + 8);
  return Block{{code_values<Z, true>(a), code_values<Z, true>(c), code_values<Z, false>(a >> 4),
                code_values<Z, false>(c >> 4)}};
}

// The lanes of sum x[j] * (u[j] - off) over whole 32-input blocks of one group, four registers
// (one per quarter of a block) added pairwise. The first block's products start the four
// registers: adding them to zero first would change only the sign of a zero sum, which the
// caller's running lanes (starting at +0) absorb, so this is the order of zero-started sums.
template <class Values>
inline V8 group_dot(const float* __restrict x, int64_t blocks, Values&& values) {
  if (blocks == 0) return V8{};
  Block w = values(0);
  V8 s0 = load8(x) * w.w[0], s1 = load8(x + 8) * w.w[1];
  V8 s2 = load8(x + 16) * w.w[2], s3 = load8(x + 24) * w.w[3];
  for (int64_t b = 1; b < blocks; ++b) {
    w = values(b);
    const float* xb = x + 32 * b;
    s0 += load8(xb) * w.w[0];
    s1 += load8(xb + 8) * w.w[1];
    s2 += load8(xb + 16) * w.w[2];
    s3 += load8(xb + 24) * w.w[3];
  }
  return (s0 + s1) + (s2 + s3);
}

// The partial last block of a group (inputs [j0, j1), fewer than 32), in input order.
inline float tail_dot(const float* x, const uint8_t* row, int64_t j0, int64_t j1, float off) {
  float t = 0.0f;
  for (int64_t j = j0; j < j1; ++j) t += x[j] * (static_cast<float>(nibble(row, j)) - off);
  return t;
}

// Outputs c[i * n + col] for rows i < m of one column. Each output adds its groups' scaled lanes
// into one 8-lane register in order, its scalar parts (the partial block of the last group, the
// minimums' terms) into `acc` in group order, and sums the lanes in a fixed tree at the end. A
// group without a partial block adds nothing to `acc`: its term would be sc * (+0), and `acc`
// (started at +0) is never -0, so adding a zero leaves it as it is. kBlocks: 32-input blocks per
// whole group (a compile-time 1, 2 or 4, or 0: read from l). With m > 1 each group's blocks are
// converted once into `w` and used by every row.
template <Int4Zero Z, int kBlocks, bool kOneRow>
inline void column(float* c, const float* x, const uint8_t* qr, const float* scale,
                   const float* min, const float* xsum, const Int4Layout& l, int64_t m,
                   int64_t col) {
  constexpr float off = Z == Int4Zero::symmetric ? 8.0f : 0.0f;
  const int64_t k = l.k, n = l.n, G = l.groups_per_row(), whole = k / l.group;
  const int64_t per_group = kBlocks > 0 ? kBlocks : l.group / 32;
  const float* sc = scale + col * G;
  const float* mn = Z == Int4Zero::asymmetric ? min + col * G : nullptr;
  V8 lanes[kInt4GemvMaxRows] = {};
  float acc[kInt4GemvMaxRows] = {};
  Block w[128 / 32];  // one group's blocks (m > 1)
  auto add_group = [&](int64_t g, int64_t blocks) {
    const int64_t j0 = g * l.group;
    const uint8_t* gb = qr + j0 / 2;  // 16 bytes per 32 inputs
    if constexpr (kOneRow) {
      lanes[0] +=
          group_dot(x + j0, blocks, [&](int64_t b) { return block_values<Z>(gb + 16 * b); }) *
          sc[g];
    } else {
      for (int64_t b = 0; b < blocks; ++b) w[b] = block_values<Z>(gb + 16 * b);
      for (int64_t i = 0; i < m; ++i)
        lanes[i] += group_dot(x + i * k + j0, blocks, [&](int64_t b) { return w[b]; }) * sc[g];
    }
  };
  for (int64_t g = 0; g < whole; ++g) {
    add_group(g, per_group);
    if constexpr (Z == Int4Zero::asymmetric)
      for (int64_t i = 0; i < m; ++i) acc[i] += mn[g] * xsum[i * G + g];
  }
  if (whole < G) {  // the last group is short: its whole blocks, then its partial block
    const int64_t j0 = whole * l.group, blocks = (k - j0) / 32, jt = j0 + 32 * blocks;
    add_group(whole, blocks);
    for (int64_t i = 0; i < m; ++i) {
      if (jt < k) acc[i] += sc[whole] * tail_dot(x + i * k, qr, jt, k, off);
      if constexpr (Z == Int4Zero::asymmetric) acc[i] += mn[whole] * xsum[i * G + whole];
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    const V8& s = lanes[i];
    c[i * n + col] = acc[i] + (((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7])));
  }
}

// Columns [c0, c1) of the rows i < m, with the group size and row count as template arguments.
template <Int4Zero Z, int kBlocks>
void columns_of(float* c, const float* x, const uint8_t* q, const float* scale, const float* min,
                const float* xsum, const Int4Layout& l, int64_t m, int64_t c0, int64_t c1) {
  for (int64_t col = c0; col < c1; ++col) {
    const uint8_t* qr = q + col * l.bytes_per_row();
    if (m == 1)
      column<Z, kBlocks, true>(c, x, qr, scale, min, xsum, l, m, col);
    else
      column<Z, kBlocks, false>(c, x, qr, scale, min, xsum, l, m, col);
  }
}

template <Int4Zero Z>
void columns(float* c, const float* x, const uint8_t* q, const float* scale, const float* min,
             const float* xsum, const Int4Layout& l, int64_t m, int64_t c0, int64_t c1) {
  switch (l.group) {
    case 32:
      return columns_of<Z, 1>(c, x, q, scale, min, xsum, l, m, c0, c1);
    case 64:
      return columns_of<Z, 2>(c, x, q, scale, min, xsum, l, m, c0, c1);
    case 128:
      return columns_of<Z, 4>(c, x, q, scale, min, xsum, l, m, c0, c1);
    default:
      return columns_of<Z, 0>(c, x, q, scale, min, xsum, l, m, c0, c1);
  }
}

// Rows [r0, r1) of the dequantized weight, a 32-input block at a time: each block's values
// u - offset as f32 (block_values: exact), times the group's scale, plus its minimum (asymmetric):
// the same two roundings, in the same order, as (u - offset) * scale + min one input at a time.
template <Int4Zero Z>
void dequantize_rows_of(float* w, const uint8_t* q, const float* scale, const float* min,
                        const Int4Layout& l, int64_t r0, int64_t r1) {
  const int64_t k = l.k, G = l.groups_per_row(), per_group = l.group / 32;
  const int64_t blocks = l.blocks_per_row(), whole = k / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* qr = q + r * l.bytes_per_row();
    float* wr = w + (r - r0) * k;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t g = r * G + b / per_group;
      const Block v = block_values<Z>(qr + 16 * b);
      const float sg = scale[g];
      const V8 s = {sg, sg, sg, sg, sg, sg, sg, sg};
      V8 out[4];
      for (int e = 0; e < 4; ++e) {
        out[e] = v.w[e] * s;
        if constexpr (Z == Int4Zero::asymmetric) out[e] += min[g];
      }
      if (b < whole) {
        for (int e = 0; e < 4; ++e) lanes8::store8(wr + 32 * b + 8 * e, out[e]);
      } else {  // the partial last block: its first k - 32 b inputs
        float t[32];
        for (int e = 0; e < 4; ++e) lanes8::store8(t + 8 * e, out[e]);
        std::memcpy(wr + 32 * b, t, static_cast<size_t>(k - 32 * b) * sizeof(float));
      }
    }
  }
}

void check_finite(const float* w, int64_t r, int64_t j) {
  NXD_CHECK(std::isfinite(w[j]), "[quantize_int4] weight [", r, ",", j, "] is ", w[j],
            " (not finite)");
}

}  // namespace

void Int4Layout::check(const char* op) const {
  NXD_CHECK(n > 0 && k > 0, "[", op, "] sizes n=", n, " k=", k);
  NXD_CHECK(group == 32 || group == 64 || group == 128, "[", op,
            "] group size must be 32, 64 or 128, got ", group);
}

void quantize_int4(uint8_t* q, float* scale, float* min, const float* w, const Int4Layout& l) {
  l.check("quantize_int4");
  const bool sym = l.zero == Int4Zero::symmetric;
  NXD_CHECK(sym || min, "[quantize_int4] the asymmetric form needs its minimums");
  std::memset(q, 0, static_cast<size_t>(l.value_bytes()));
  const int64_t G = l.groups_per_row(), bpr = l.bytes_per_row();
  for (int64_t r = 0; r < l.n; ++r) {
    const float* wr = w + r * l.k;
    uint8_t* qr = q + r * bpr;
    std::vector<int> u(static_cast<size_t>(32 * l.blocks_per_row()), sym ? 8 : 0);  // padding: 0
    for (int64_t g = 0; g < G; ++g) {
      const int64_t j0 = g * l.group, j1 = std::min(l.k, j0 + l.group);
      float lo = wr[j0], hi = wr[j0], amax = 0.0f;
      for (int64_t j = j0; j < j1; ++j) {
        check_finite(wr, r, j);
        lo = std::min(lo, wr[j]), hi = std::max(hi, wr[j]), amax = std::max(amax, std::abs(wr[j]));
      }
      // the quotients in f64 so that each rounding is of the exact value
      const float s = sym ? amax / 7.0f : (hi - lo) / 15.0f;
      scale[r * G + g] = s;
      if (!sym) min[r * G + g] = lo;
      for (int64_t j = j0; j < j1 && s != 0.0f; ++j) {
        const double v = sym ? static_cast<double>(wr[j]) / s
                             : (static_cast<double>(wr[j]) - static_cast<double>(lo)) / s;
        u[j] = static_cast<int>(std::clamp(std::nearbyint(v), sym ? -7.0 : 0.0, sym ? 7.0 : 15.0)) +
               (sym ? 8 : 0);
      }
    }
    for (int64_t b = 0; b < l.blocks_per_row(); ++b)
      for (int64_t i = 0; i < 16; ++i)
        qr[16 * b + i] = static_cast<uint8_t>(u[32 * b + i] | (u[32 * b + 16 + i] << 4));
  }
}

void dequantize_int4_rows(float* w, const uint8_t* q, const float* scale, const float* min,
                          const Int4Layout& l, int64_t r0, int64_t r1) {
  if (l.zero == Int4Zero::symmetric)
    dequantize_rows_of<Int4Zero::symmetric>(w, q, scale, min, l, r0, r1);
  else
    dequantize_rows_of<Int4Zero::asymmetric>(w, q, scale, min, l, r0, r1);
}

void gemv_int4(float* c, const float* x, const uint8_t* q, const float* scale, const float* min,
               const Int4Layout& l, int64_t m) {
  const int64_t n = l.n, k = l.k, G = l.groups_per_row();
  const bool asym = l.zero == Int4Zero::asymmetric;
  std::vector<float> xsum;  // asymmetric: sum of x over each group, row by row, in input order
  if (asym) {
    xsum.assign(static_cast<size_t>(m * G), 0.0f);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < k; ++j) xsum[i * G + j / l.group] += x[i * k + j];
  }
  // at most kInt4GemvMaxRows rows at a time (each output is computed by itself: any split of the
  // rows gives the same bits)
  for (int64_t i0 = 0; i0 < m; i0 += kInt4GemvMaxRows) {
    const int64_t mi = std::min(kInt4GemvMaxRows, m - i0);
    float* ci = c + i0 * n;
    const float* xi = x + i0 * k;
    const float* si = asym ? xsum.data() + i0 * G : nullptr;
    for_rows((n + 7) / 8, 8 * mi * k, [&](int64_t q0, int64_t q1) {
      const int64_t c0 = 8 * q0, c1 = std::min(n, 8 * q1);
      if (asym)
        columns<Int4Zero::asymmetric>(ci, xi, q, scale, min, si, l, mi, c0, c1);
      else
        columns<Int4Zero::symmetric>(ci, xi, q, scale, min, si, l, mi, c0, c1);
    });
  }
}

void gemm_int4_weight_blocks(float* c, const float* x, const uint8_t* q, const float* scale,
                             const float* min, const Int4Layout& l, int64_t m) {
  detail::gemm_dequantized_blocks(c, x, m, l.n, l.k, [&](float* w, int64_t r0, int64_t r1) {
    dequantize_int4_rows(w, q, scale, min, l, r0, r1);
  });
}

void linear_int4(float* c, const float* x, const uint8_t* q, const float* scale, const float* min,
                 const Int4Layout& l, int64_t m) {
  l.check("linear_int4");
  NXD_CHECK(m >= 0, "[linear_int4] m=", m);
  if (m == 0) return;
  if (l.act == Int4Activations::int8_blocks)
    gemv_int4_q8(c, x, q, scale, min, l, m);
  else if (m <= kInt4GemvMaxRows)
    gemv_int4(c, x, q, scale, min, l, m);
  else
    gemm_int4_weight_blocks(c, x, q, scale, min, l, m);
}

namespace ref {

void linear_int4(float* c, const float* x, const uint8_t* q, const float* scale, const float* min,
                 const Int4Layout& l, int64_t m) {
  std::vector<float> w(static_cast<size_t>(l.n * l.k));
  dequantize_int4_rows(w.data(), q, scale, min, l, 0, l.n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < l.n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < l.k; ++p)
        acc += static_cast<double>(x[i * l.k + p]) * static_cast<double>(w[j * l.k + p]);
      c[i * l.n + j] = static_cast<float>(acc);
    }
}

}  // namespace ref

}  // namespace nxd::kernels

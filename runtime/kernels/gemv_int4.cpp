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

float offset_of(const Int4Layout& l) {
  return l.zero == Int4Zero::symmetric ? 8.0f : 0.0f;
}

// The 4-bit value of input j of a row.
inline int nibble(const uint8_t* row, int64_t j) {
  const uint8_t b = row[16 * (j / 32) + (j % 16)];
  return (j % 32) < 16 ? (b & 15) : (b >> 4);
}

// Eight low (or high) nibbles of bytes p[0..8) as f32 values minus `off` (widened to int32 as
// lanes8::widen8 explains; exact).
inline V8 lo8(const uint8_t* p, float off) {
  return __builtin_convertvector(lanes8::widen8(p) & 15, V8) - off;
}
inline V8 hi8(const uint8_t* p, float off) {
  return __builtin_convertvector(lanes8::widen8(p) >> 4, V8) - off;
}

// The whole 32-input blocks of inputs [j0, j1) of one group (j0 a multiple of 32): the lanes of
// sum x[j] * (u[j] - off), four registers (inputs 0-7, 8-15, 16-23, 24-31 of each block) added
// pairwise. `*tail` gets the partial last block's sum, in input order.
inline V8 group_lanes(const float* __restrict x, const uint8_t* __restrict row, int64_t j0,
                      int64_t j1, float off, float* tail) {
  V8 s0 = {}, s1 = {}, s2 = {}, s3 = {};
  int64_t j = j0;
  for (; j + 32 <= j1; j += 32) {
    const uint8_t* b = row + j / 2;  // 16 bytes per 32 inputs
    s0 += load8(x + j) * lo8(b, off);
    s1 += load8(x + j + 8) * lo8(b + 8, off);
    s2 += load8(x + j + 16) * hi8(b, off);
    s3 += load8(x + j + 24) * hi8(b + 8, off);
  }
  float t = 0.0f;
  for (; j < j1; ++j) t += x[j] * (static_cast<float>(nibble(row, j)) - off);
  *tail = t;
  return (s0 + s1) + (s2 + s3);
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
  const float off = offset_of(l);
  const int64_t G = l.groups_per_row();
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* qr = q + r * l.bytes_per_row();
    float* wr = w + (r - r0) * l.k;
    for (int64_t j = 0; j < l.k; ++j) {
      const int64_t g = r * G + j / l.group;
      const float v = (static_cast<float>(nibble(qr, j)) - off) * scale[g];
      wr[j] = min ? v + min[g] : v;
    }
  }
}

void gemv_int4(float* c, const float* x, const uint8_t* q, const float* scale, const float* min,
               const Int4Layout& l, int64_t m) {
  const int64_t n = l.n, k = l.k, G = l.groups_per_row();
  const float off = offset_of(l);
  const bool asym = l.zero == Int4Zero::asymmetric;
  std::vector<float> xsum;  // asymmetric: sum of x over each group, row by row, in input order
  if (asym) {
    xsum.assign(static_cast<size_t>(m * G), 0.0f);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < k; ++j) xsum[i * G + j / l.group] += x[i * k + j];
  }
  for_rows((n + 7) / 8, 8 * m * k, [&](int64_t q0, int64_t q1) {
    const int64_t c0 = 8 * q0, c1 = std::min(n, 8 * q1);
    for (int64_t col = c0; col < c1; ++col) {
      const uint8_t* qr = q + col * l.bytes_per_row();
      for (int64_t i = 0; i < m; ++i) {
        const float* xi = x + i * k;
        // each group's lanes scaled into one register, the scalar parts (partial blocks,
        // minimums) apart; one horizontal sum per output
        V8 lanes = {};
        float acc = 0.0f;
        for (int64_t g = 0; g < G; ++g) {
          const int64_t j0 = g * l.group, j1 = std::min(k, j0 + l.group);
          const float sc = scale[col * G + g];
          float tail;
          lanes += group_lanes(xi, qr, j0, j1, off, &tail) * sc;
          acc += sc * tail;
          if (asym) acc += min[col * G + g] * xsum[i * G + g];
        }
        acc += ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
               ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
        c[i * n + col] = acc;
      }
    }
  });
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
  if (m <= kInt4GemvMaxRows)
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

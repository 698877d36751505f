#include "nxd/runtime/kernels/gemv_int8.h"

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

// R rows of x (contiguous, k apart) against one weight row w: out[r] = lanes8::dot(x_r, w, k),
// bitwise (the same four 8-lane sums in the same order, then dot's epilogue and tail), with each
// load and widening of w serving the R rows (the widening, not the multiply-adds, bounded a
// product of many rows). The tile's size changes which products share a load, never a value.
template <int R>
inline void dot_rows(const float* __restrict x, int64_t k, const int8_t* __restrict w, float* out) {
  V8 s[R][4] = {};
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    const V8 w0 = load8(w + i), w1 = load8(w + i + 8), w2 = load8(w + i + 16),
             w3 = load8(w + i + 24);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * k + i;
      s[r][0] += load8(xr) * w0;
      s[r][1] += load8(xr + 8) * w1;
      s[r][2] += load8(xr + 16) * w2;
      s[r][3] += load8(xr + 24) * w3;
    }
  }
  for (; i + 8 <= k; i += 8) {
    const V8 w0 = load8(w + i);
    for (int r = 0; r < R; ++r) s[r][0] += load8(x + r * k + i) * w0;
  }
  for (int r = 0; r < R; ++r) {
    const V8 t = (s[r][0] + s[r][1]) + (s[r][2] + s[r][3]);
    float v = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
    for (int64_t j = i; j < k; ++j) v += x[r * k + j] * static_cast<float>(w[j]);
    out[r] = v;
  }
}

// Rows per tile: its accumulators and the four weight registers fit the register file (32
// AVX-512 registers; 16 AVX2 ones; SSE holds one 8-lane value in two).
#if defined(__AVX512F__)
constexpr int kTileRows = 4;
#elif defined(__AVX__)
constexpr int kTileRows = 2;
#else
constexpr int kTileRows = 1;
#endif

// `rows` (1..kTileRows) rows of x against w: dot_rows with R = rows.
void tile_rows(int64_t rows, const float* x, int64_t k, const int8_t* w, float* out) {
  if (rows == 1) return dot_rows<1>(x, k, w, out);
  if constexpr (kTileRows >= 2)
    if (rows == 2) return dot_rows<2>(x, k, w, out);
  if constexpr (kTileRows >= 3)
    if (rows == 3) return dot_rows<3>(x, k, w, out);
  if constexpr (kTileRows >= 4) return dot_rows<4>(x, k, w, out);
}

// Rows [r0, r1) of q * scale into w (f32, [r1 - r0, k]).
void dequantize_rows(float* w, const int8_t* q, const float* scale, int64_t r0, int64_t r1,
                     int64_t k) {
  for (int64_t r = r0; r < r1; ++r) {
    const float s = scale[r];
    const int8_t* qr = q + r * k;
    float* wr = w + (r - r0) * k;
    for (int64_t j = 0; j < k; ++j) wr[j] = static_cast<float>(qr[j]) * s;
  }
}

}  // namespace

void int8_row_scales(float* scale, const float* w, int64_t n, int64_t k) {
  for (int64_t r = 0; r < n; ++r) {
    const float* wr = w + r * k;
    float amax = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      NXD_CHECK(std::isfinite(wr[j]), "[quantize_int8] weight [", r, ",", j, "] is ", wr[j],
                " (not finite)");
      amax = std::max(amax, std::abs(wr[j]));
    }
    scale[r] = amax / 127.0f;
  }
}

void quantize_int8_with_scales(int8_t* q, const float* scale, const float* w, int64_t n,
                               int64_t k) {
  for (int64_t r = 0; r < n; ++r) {
    const float* wr = w + r * k;
    const float s = scale[r];
    int8_t* qr = q + r * k;
    if (s == 0.0f) {
      std::fill(qr, qr + k, int8_t{0});
      continue;
    }
    for (int64_t j = 0; j < k; ++j) {
      // the quotient in f64 so that the rounding is of the exact w / s
      const double v = std::nearbyint(static_cast<double>(wr[j]) / static_cast<double>(s));
      qr[j] = static_cast<int8_t>(std::clamp(v, -127.0, 127.0));
    }
  }
}

void quantize_int8_rows(int8_t* q, float* scale, const float* w, int64_t n, int64_t k) {
  int8_row_scales(scale, w, n, k);
  quantize_int8_with_scales(q, scale, w, n, k);
}

void gemv_int8(float* c, const float* x, const int8_t* q, const float* scale, int64_t m, int64_t n,
               int64_t k) {
  // Columns of C are independent: split them over the pool, 8 at a time.
  for_rows((n + 7) / 8, 16 * m * k, [&](int64_t q0, int64_t q1) {
    const int64_t j0 = 8 * q0, j1 = std::min(n, 8 * q1);
    float out[kTileRows];
    for (int64_t j = j0; j < j1; ++j) {
      const int8_t* qr = q + j * k;
      for (int64_t i = 0; i < m; i += kTileRows) {
        const int64_t rows = std::min<int64_t>(kTileRows, m - i);
        tile_rows(rows, x + i * k, k, qr, out);
        for (int64_t r = 0; r < rows; ++r) c[(i + r) * n + j] = scale[j] * out[r];
      }
    }
  });
}

void gemm_int8_weight_blocks(float* c, const float* x, const int8_t* q, const float* scale,
                             int64_t m, int64_t n, int64_t k) {
  detail::gemm_dequantized_blocks(c, x, m, n, k, [&](float* w, int64_t r0, int64_t r1) {
    dequantize_rows(w, q, scale, r0, r1, k);
  });
}

void linear_int8(float* c, const float* x, const int8_t* q, const float* scale, int64_t m,
                 int64_t n, int64_t k) {
  NXD_CHECK(m >= 0 && n > 0 && k > 0, "[linear_int8] sizes m=", m, " n=", n, " k=", k);
  if (m == 0) return;
  if (m <= kInt8GemvMaxRows)
    gemv_int8(c, x, q, scale, m, n, k);
  else
    gemm_int8_weight_blocks(c, x, q, scale, m, n, k);
}

namespace ref {

void linear_int8(float* c, const float* x, const int8_t* q, const float* scale, int64_t m,
                 int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p)
        acc += static_cast<double>(x[i * k + p]) *
               (static_cast<double>(q[j * k + p]) * static_cast<double>(scale[j]));
      c[i * n + j] = static_cast<float>(acc);
    }
}

}  // namespace ref

}  // namespace nxd::kernels

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

using lanes8::dot;  // runtime/gemv_f32.cpp's order, the weights widened from int8

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
    for (int64_t j = j0; j < j1; ++j) {
      const int8_t* qr = q + j * k;
      for (int64_t i = 0; i < m; ++i) c[i * n + j] = scale[j] * dot(x + i * k, qr, k);
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

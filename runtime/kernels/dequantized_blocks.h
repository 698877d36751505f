#pragma once
// Internal (gemv_int8.cpp, gemv_int4.cpp): the prefill path of a weight-only quantized linear
// layer. c [m, n] = x [m, k] @ W^T for a W [n, k] that exists only quantized: blocks of about
// 512 KiB of its rows (at least 16) are dequantized into a per-thread f32 scratch, in parallel
// over rows, and multiplied there by blas::sgemm; never a whole f32 copy of W.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::kernels::detail {

// dequantize(w, r0, r1) writes rows [r0, r1) of W into w (f32, [r1 - r0, k]).
template <class Dequantize>
void gemm_dequantized_blocks(float* c, const float* x, int64_t m, int64_t n, int64_t k,
                             Dequantize&& dequantize) {
  const int64_t nb = std::clamp<int64_t>((int64_t{1} << 19) / (4 * k), 16, n);
  thread_local std::vector<float> ws;
  if (static_cast<int64_t>(ws.size()) < nb * k) ws.resize(static_cast<size_t>(nb * k));
  for (int64_t n0 = 0; n0 < n; n0 += nb) {
    const int64_t rows = std::min(nb, n - n0);
    float* w = ws.data();
    for_rows(rows, k, [&](int64_t r0, int64_t r1) { dequantize(w + r0 * k, n0 + r0, n0 + r1); });
    // C[m, rows] = X[m, k] @ W[rows, k]^T
    blas::sgemm(/*trans_a=*/false, /*trans_b=*/true, m, rows, k, 1.0f, x, k, w, k, 0.0f, c + n0, n);
  }
}

}  // namespace nxd::kernels::detail

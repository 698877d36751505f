#include "nxd/runtime/kernels/gemv_bf16.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/gemm_bf16.h"
#include "nxd/runtime/gemv_f32.h"
#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::kernels::detail {

namespace {

inline float bf(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Rows of W widened to f32 per block: 16 rows of a 4,096-wide weight are 256 KiB, in L2.
constexpr int64_t kWidenRows = 16;

}  // namespace

bool gemv_bf16(const Tensor& c, const Tensor& a, const Tensor& b, double alpha, double beta) {
  if (c.dtype() != DType::bf16 || a.dtype() != DType::bf16 || b.dtype() != DType::bf16)
    return false;
  if (b.dim() != 2 || a.dim() < 2 || c.dim() != a.dim()) return false;
  const int64_t K = b.size(0), N = b.size(1);
  if (a.size(-1) != K || c.size(-1) != N || K < 16) return false;
  const int64_t M = a.numel() / K;
  if (M < 1 || M > kGemvMaxRows || c.numel() != M * N) return false;
  if (b.stride(0) != 1 || b.stride(1) != K) return false;  // W [N, K] row-major, viewed as W^T
  if (!a.is_contiguous() || !c.is_contiguous()) return false;
  if (beta != 0.0 && beta != 1.0) return false;
  const uint16_t* w = static_cast<const uint16_t*>(b.raw_data());
  uint16_t* cp = static_cast<uint16_t*>(c.raw_data());
  thread_local std::vector<float> xs;
  if (static_cast<int64_t>(xs.size()) < M * K) xs.resize(M * K);
  bf16_to_f32(xs.data(), static_cast<const uint16_t*>(a.raw_data()), M * K);
  const float* x = xs.data();
  const float al = static_cast<float>(alpha);
  const bool acc = beta == 1.0;
  // Columns of C (rows of W) are independent: split them over the pool, kWidenRows at a time.
  for_rows((N + kWidenRows - 1) / kWidenRows, 2 * M * K * kWidenRows, [&](int64_t q0, int64_t q1) {
    thread_local std::vector<float> ws, out;
    if (static_cast<int64_t>(ws.size()) < kWidenRows * K) ws.resize(kWidenRows * K);
    if (static_cast<int64_t>(out.size()) < M * kWidenRows) out.resize(M * kWidenRows);
    for (int64_t n0 = q0 * kWidenRows; n0 < std::min(N, q1 * kWidenRows); n0 += kWidenRows) {
      const int64_t nb = std::min(kWidenRows, N - n0);
      bf16_to_f32(ws.data(), w + n0 * K, nb * K);
      blas::detail::small_rows_times_bt(M, K, x, 0, nb, al, ws.data(), K, 0.0f, out.data(),
                                        kWidenRows);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < nb; ++j) {
          float v = out[m * kWidenRows + j];
          if (acc) v += bf(cp[m * N + n0 + j]);
          cp[m * N + n0 + j] = bf16::from_f32(v);
        }
    }
  });
  return true;
}

bool gemm_bf16_weight_blocks(const Tensor& c, const Tensor& a, const Tensor& b, double alpha,
                             double beta) {
  if (c.dtype() != DType::bf16 || a.dtype() != DType::bf16 || b.dtype() != DType::bf16)
    return false;
  if (b.dim() != 2 || a.dim() < 2 || c.dim() != a.dim()) return false;
  const int64_t K = b.size(0), N = b.size(1);
  if (a.size(-1) != K || c.size(-1) != N || K < 1) return false;
  const int64_t M = a.numel() / K;
  if (M < 1 || c.numel() != M * N) return false;
  if (b.stride(0) != 1 || b.stride(1) != K) return false;
  if (!a.is_contiguous() || !c.is_contiguous()) return false;
  const uint16_t* w = static_cast<const uint16_t*>(b.raw_data());
  thread_local std::vector<float> xs, cs, ws;
  if (static_cast<int64_t>(xs.size()) < M * K) xs.resize(M * K);
  if (static_cast<int64_t>(cs.size()) < M * N) cs.resize(M * N);
  bf16_to_f32(xs.data(), static_cast<const uint16_t*>(a.raw_data()), M * K);
  if (beta != 0.0) bf16_to_f32(cs.data(), static_cast<const uint16_t*>(c.raw_data()), M * N);
  const int64_t nb = std::clamp<int64_t>((int64_t{1} << 19) / (4 * K), 16, N);
  if (static_cast<int64_t>(ws.size()) < nb * K) ws.resize(nb * K);
  // the operands are bf16 values: the bf16 GEMM kernel (AMX / AVX512-BF16) takes them exactly
  const blas::Bf16Kernel kernel = blas::bf16_kernel();
  const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t n = std::min(nb, N - n0);
    bf16_to_f32(ws.data(), w + n0 * K, n * K);
    // C[M, n] = X[M, K] @ W[n, K]^T: a as stored, b transposed
    if (kernel == blas::Bf16Kernel::portable)
      blas::sgemm(/*trans_a=*/false, /*trans_b=*/true, M, n, K, al, xs.data(), K, ws.data(), K, be,
                  cs.data() + n0, N);
    else
      blas::detail::gemm_bf16_x86(kernel, /*trans_a=*/false, /*trans_b=*/true, M, n, K, al,
                                  xs.data(), K, ws.data(), K, be, cs.data() + n0, N,
                                  blas::threads());
  }
  f32_to_bf16(static_cast<uint16_t*>(c.raw_data()), cs.data(), M * N);
  return true;
}

}  // namespace nxd::kernels::detail

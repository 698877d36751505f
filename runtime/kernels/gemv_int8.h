#pragma once
// int8 weight-only linear layers (generation): a weight W [N, K] stored as int8 values q [N, K]
// and one f32 scale per output row, W[n, k] ~ q[n, k] * scale[n] (symmetric, per output
// channel). The product C[M, N] = X[M, K] @ (q * scale)^T reads one byte per weight instead of
// four (f32) or two (bf16): a decode step, which reads every weight once, is bound by those
// bytes.
//
// Two paths, both bitwise independent of the thread count, the split and the operands' addresses:
// - m <= kInt8GemvMaxRows (decode): each output is scale[n] * sum_k x[m, k] q[n, k], one f32 dot
//   product over the whole K in a fixed order (32 lanes in four registers, combined pairwise,
//   then the tail: the order of runtime/gemv_f32.cpp), computed by one thread; the columns are
//   split over nxd's compute pool.
// - more rows (prefill): W is dequantized (q * scale, in f32) a block of rows at a time into a
//   cache-sized scratch and multiplied there by blas::sgemm; never a whole f32 copy of W.
#include <cstdint>

namespace nxd::kernels {

// A serving step's decode rows, as many as the f32 few-rows kernel takes (runtime/gemv_f32.h:
// kSmallRows): each row's bits are then the same alone as beside up to 31 others.
inline constexpr int64_t kInt8GemvMaxRows = 32;

// Per-row symmetric quantization of w [n, k] (f32, contiguous): scale[r] = max_j |w[r, j]| / 127
// and q[r, j] = w[r, j] / scale[r] rounded to nearest (ties to even), in [-127, 127]; a row of
// zeros gets scale 0 and q 0. |w - q * scale| <= scale / 2 for every finite w. Throws on a
// non-finite weight (naming its row and column).
void quantize_int8_rows(int8_t* q, float* scale, const float* w, int64_t n, int64_t k);
// Its two halves, for rows split over ranks (tensor parallelism along the input): the scales of
// this part of each row (the row's scale is the largest over the parts: x -> x / 127 rounded is
// monotone), then q from given scales.
void int8_row_scales(float* scale, const float* w, int64_t n, int64_t k);
void quantize_int8_with_scales(int8_t* q, const float* scale, const float* w, int64_t n, int64_t k);

// c [m, n] = x [m, k] @ (q [n, k] * scale [n])^T, all contiguous; picks the path by m.
void linear_int8(float* c, const float* x, const int8_t* q, const float* scale, int64_t m,
                 int64_t n, int64_t k);

// The decode path (any m, meant for m <= kInt8GemvMaxRows).
void gemv_int8(float* c, const float* x, const int8_t* q, const float* scale, int64_t m, int64_t n,
               int64_t k);

// The prefill path (any m): blocks of dequantized rows and blas::sgemm.
void gemm_int8_weight_blocks(float* c, const float* x, const int8_t* q, const float* scale,
                             int64_t m, int64_t n, int64_t k);

namespace ref {
// Naive: c[i, j] = sum_p x[i, p] * (q[j, p] * scale[j]) accumulated in f64, rounded once.
void linear_int8(float* c, const float* x, const int8_t* q, const float* scale, int64_t m,
                 int64_t n, int64_t k);
}  // namespace ref

}  // namespace nxd::kernels

#pragma once
// 4-bit group-wise weight-only linear layers (generation): a weight W [N, K] stored as 4-bit
// values in groups of `group` consecutive inputs of a row (group 32, 64 or 128), each group with
// its own f32 scale, and for the asymmetric form its own f32 minimum:
//   symmetric:  W[n, k] ~ (u - 8) * scale[n, g],        u in [1, 15], scale = max |w| / 7
//   asymmetric: W[n, k] ~ u * scale[n, g] + min[n, g],  u in [0, 15], scale = (max - min) / 15
// with g = k / group; |W - dequantized| <= scale / 2 for every finite weight. A decode step reads
// half a byte per weight plus 4 (or 8) bytes per group: 0.625 bytes per weight at group 32
// symmetric, against 4 for f32.
//
// Storage, per row: ceil(K / 32) blocks of 16 bytes; byte l of a block holds input 32b + l in
// its low nibble and input 32b + 16 + l in its high nibble (the layout of llama.cpp's Q4_0
// blocks, so that both halves of a block meet contiguous inputs). Inputs past K in the last block
// hold the value 0 (u = 8 symmetric, u = 0 asymmetric) and are never read.
//
// Paths, both bitwise independent of the thread count, the split and the operands' addresses:
// - m <= kInt4GemvMaxRows (decode): each output is sum over groups, in order, of
//   scale * dot(x_group, u - offset) (+ min * sum(x_group) asymmetric): each group's 32 lanes
//   (its whole blocks) are combined into 8 and added, scaled, into one 8-lane register, summed
//   in a fixed tree once per output; partial blocks and minimums are summed apart, in order; the
//   columns are split over nxd's compute pool. Each 8 bytes of a block are widened to int32 once
//   for both nibbles; the codes become u - offset in f32 by one two-table permute (AVX-512VL) or
//   by masking, an int32 subtraction and a conversion (exact either way: the same bits on every
//   build); a group's blocks are converted once for all rows, and the group loop is unrolled for
//   groups of 32, 64 and 128.
// - more rows (prefill): blocks of dequantized rows multiplied by blas::sgemm.
#include <cstdint>

namespace nxd::kernels {

// As kInt8GemvMaxRows: a serving step's decode rows, each with its bits alone.
inline constexpr int64_t kInt4GemvMaxRows = 32;

enum class Int4Zero { symmetric, asymmetric };

// How the activations meet the 4-bit weights (gemv_int4_q8.cpp):
// - f32: f32 activations times the dequantized weights (the default; the paths below).
// - int8_blocks: each row's activations quantized per 32-input block to int8 with an f32 scale
//   (llama.cpp's Q8_0: d = max |x| / 127, q = x / d rounded to nearest even) and the weights'
//   codes multiplied with them in exact integer dot products, for every m. A different
//   numerical answer (the activations move by at most d / 2), the same bits on every build.
enum class Int4Activations { f32, int8_blocks };

// The shape of a 4-bit weight and the sizes of its arrays.
struct Int4Layout {
  int64_t n = 0, k = 0, group = 32;
  Int4Zero zero = Int4Zero::symmetric;
  Int4Activations act = Int4Activations::f32;
  int64_t blocks_per_row() const { return (k + 31) / 32; }
  int64_t bytes_per_row() const { return 16 * blocks_per_row(); }
  int64_t groups_per_row() const { return (k + group - 1) / group; }
  int64_t value_bytes() const { return n * bytes_per_row(); }
  int64_t groups() const { return n * groups_per_row(); }
  // Throws InvalidArgument unless n, k > 0 and group is 32, 64 or 128.
  void check(const char* op) const;
};

// Quantizes w [n, k] (f32, contiguous) into q (value_bytes()), scale (groups()) and, asymmetric,
// min (groups(); null symmetric). Throws on a non-finite weight, naming its row and column.
void quantize_int4(uint8_t* q, float* scale, float* min, const float* w, const Int4Layout& l);

// Rows [r0, r1) of the dequantized weight into w (f32, [r1 - r0, k]).
void dequantize_int4_rows(float* w, const uint8_t* q, const float* scale, const float* min,
                          const Int4Layout& l, int64_t r0, int64_t r1);

// c [m, n] = x [m, k] @ dequantized(W)^T, all contiguous; picks the path by m.
void linear_int4(float* c, const float* x, const uint8_t* q, const float* scale, const float* min,
                 const Int4Layout& l, int64_t m);
// The decode path (any m, meant for m <= kInt4GemvMaxRows; more rows are taken 8 at a time).
void gemv_int4(float* c, const float* x, const uint8_t* q, const float* scale, const float* min,
               const Int4Layout& l, int64_t m);
// The prefill path (any m).
void gemm_int4_weight_blocks(float* c, const float* x, const uint8_t* q, const float* scale,
                             const float* min, const Int4Layout& l, int64_t m);

// The int8_blocks product (any m; linear_int4 takes it for every m when l.act says so). Per row,
// 32-input block b (the last one zero-padded) and output column: I_b = the exact integer sum
// over the block of q[j] * (u[j] - offset); per group, in order, float(I_b) * d_b summed over
// its blocks (the first starts the sum), times the group's scale, added to a running f32 sum L
// (from +0); asymmetric, min * (the f32 sum of the group's x, in input order) added to another,
// A, and the output is A + L (symmetric: L). The integer sums are exact (VNNI vpdpbusd, AVX2 or
// SSSE3 vpmaddubsw + vpmaddwd, or a plain loop), so every build gives the same bits; each output
// is computed by itself (any m, thread count and split give the same bits). 8 columns share one
// register of the f32 steps; a group's weight blocks are unpacked once for up to 32 rows.
void gemv_int4_q8(float* c, const float* x, const uint8_t* q, const float* scale, const float* min,
                  const Int4Layout& l, int64_t m);
// One row's activations x [k] as int8_blocks quantizes them: q [32 * ceil(k / 32)] (the padding
// 0) and d [ceil(k / 32)]. A block with a non-finite value gets q = 0 and d = NaN (its products
// are NaN).
void quantize_int4_activations(int8_t* q, float* d, const float* x, int64_t k);

namespace ref {
// Naive: c[i, j] = sum_p x[i, p] * W[j, p] (dequantized) accumulated in f64, rounded once.
void linear_int4(float* c, const float* x, const uint8_t* q, const float* scale, const float* min,
                 const Int4Layout& l, int64_t m);
}  // namespace ref

}  // namespace nxd::kernels

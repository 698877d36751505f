#pragma once
// Internal (runtime/kernels/matmul.cpp): the bf16 product of a few rows against a linear layer's
// weight, read as bf16 where it lies: C[m, n] = alpha * sum_k A[m, k] W[n, k] + beta * C[m, n]
// for A [.., M, K] (contiguous, M = rows over every batch dim <= kGemvMaxRows), B = W^T with W
// [N, K] contiguous (the view linear passes), C [.., M, N] contiguous, all bf16. Each output is
// one f32 dot product in a fixed order (16 lanes over k, then the lanes pairwise), rounded once:
// results do not depend on M, the thread count or the split. Decode steps are this shape; the
// general bf16 path converts the whole weight to f32 on every call.
#include "nxd/runtime/tensor.h"

namespace nxd::kernels::detail {

inline constexpr int64_t kGemvMaxRows = 8;

// Computes and returns true when the operands have that shape; false (nothing done) otherwise.
bool gemv_bf16(const Tensor& c, const Tensor& a, const Tensor& b, double alpha, double beta);

// The same operand shapes with any number of rows (a prefill): W is converted to f32 a block of
// rows at a time into a cache-sized scratch and multiplied there by the bf16 GEMM kernel (AMX or
// AVX512-BF16, exact on bf16 operands; the f32 engine on CPUs with neither), C accumulated in f32
// and rounded once; never a whole f32 copy of W. Returns false (nothing done) for other shapes.
bool gemm_bf16_weight_blocks(const Tensor& c, const Tensor& a, const Tensor& b, double alpha,
                             double beta);

}  // namespace nxd::kernels::detail

#pragma once
// Internal (runtime/kernels/matmul.cpp): the bf16 product of a few rows against a linear layer's
// weight, read as bf16 where it lies: C[m, n] = alpha * sum_k A[m, k] W[n, k] + beta * C[m, n]
// for A [.., M, K] (contiguous, M = rows over every batch dim <= kGemvMaxRows), B = W^T with W
// [N, K] contiguous (the view linear passes), C [.., M, N] contiguous, all bf16. The weight is
// widened to f32 a few rows at a time (exactly: a bf16 value is an f32 one) and each widened row
// serves all M rows of A through the f32 few-rows kernel (runtime/gemv_f32.h): every output is
// lanes8::dot of its row of A and its row of W, in f32, rounded to bf16 once. Results therefore do
// not depend on M, the thread count, the split or the build's instruction set (the file is
// compiled without fused multiply-adds): a decode row's bits are the same alone as in a serving
// batch of up to 32. Decode steps are this shape; the general bf16 path converts the whole weight
// to f32 on every call.
#include "nxd/runtime/tensor.h"

namespace nxd::kernels::detail {

inline constexpr int64_t kGemvMaxRows = 32;

// Computes and returns true when the operands have that shape; false (nothing done) otherwise.
bool gemv_bf16(const Tensor& c, const Tensor& a, const Tensor& b, double alpha, double beta);

// The same operand shapes with any number of rows (a prefill): W is converted to f32 a block of
// rows at a time into a cache-sized scratch and multiplied there by the bf16 GEMM kernel (AMX or
// AVX512-BF16, exact on bf16 operands; the f32 engine on CPUs with neither), C accumulated in f32
// and rounded once; never a whole f32 copy of W. Returns false (nothing done) for other shapes.
bool gemm_bf16_weight_blocks(const Tensor& c, const Tensor& a, const Tensor& b, double alpha,
                             double beta);

}  // namespace nxd::kernels::detail

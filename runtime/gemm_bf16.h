#pragma once
// Internal: the x86 bf16 GEMM kernels behind blas::sgemm's bf16 matmul precision (blas.h).
// f32 operands are rounded to bf16 (round to nearest even) while they are packed, products are
// accumulated in f32. Both kernels share one packed layout:
//   A: strips of 16 rows, each a run of 16x32 bf16 tiles along K (row r holds 32 consecutive k);
//   B: strips of 16 columns, each a run of 16x16 pair tiles along K (row q holds, for every
//      column, the pair k = 2q, 2q+1: the "VNNI" layout TDPBF16PS and VDPBF16PS read);
// K is zero-padded to a multiple of 32, M and N to a multiple of 16.
// The AMX kernel runs 2x2 blocks of 16x16 f32 accumulator tiles; the AVX512-BF16 kernel runs
// 8x32 register blocks with VDPBF16PS. Like the hardware instructions, both treat bf16 subnormal
// inputs as zero.
#include <cstdint>

#include "nxd/runtime/blas.h"

namespace nxd::blas::detail {

// cpuid (and XCR0) support for the instructions each kernel uses; for AMX also the Linux
// permission to use tile data (requested once per process with arch_prctl).
bool cpu_has_avx512_bf16();
bool cpu_has_amx_bf16();

// C[m,n] = alpha * op(A) @ op(B) + beta * C with the kernel (amx or avx512_bf16, which must be
// available), split over up to `threads` pool threads. Every element of C is computed by one
// thread over the whole K in a fixed order: results do not depend on the thread count.
// Requires m, n, k > 0 (sgemm handles the degenerate cases).
void gemm_bf16_x86(Bf16Kernel kernel, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                   float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                   float beta, float* c, int64_t ldc, int threads);

// Tests: makes bf16_kernel_available(k) report false (or true again, if the CPU has it), so
// the handling of a missing kernel can be tested on a machine that has every kernel.
void hide_bf16_kernel_for_testing(Bf16Kernel k, bool hidden);

}  // namespace nxd::blas::detail

#pragma once
// The one place nxd calls BLAS. Row-major sgemm with explicit leading dimensions so strided
// (transposed or sliced) operands go to BLAS without copies.
#include <cstdint>

namespace nxd::blas {

// C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C, row-major; op = transpose when trans_*.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
           const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
           int64_t ldc);

void set_threads(int n);  // OpenBLAS's pool size (process-wide)
int threads();

}  // namespace nxd::blas

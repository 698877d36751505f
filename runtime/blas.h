#pragma once
// The one place nxd calls BLAS. Row-major GEMM with explicit leading dimensions so strided
// (transposed or sliced) operands are used in place, without copies.
//
// f32 GEMM has two engines. OpenBLAS (cblas_sgemm) and Eigen's GEBP kernel compiled for this
// CPU. When nxd is built with AVX-512 (-march=native on an AVX-512 machine) the default is
// Eigen: Debian's OpenBLAS 0.3.21 runs its Haswell (AVX2) kernel on machines where
// OPENBLAS_CORETYPE=Haswell is forced (as on our CI), and Eigen's AVX-512 kernel measured ~1.45x
// faster on every transformer shape (see bench/matmul). NXD_GEMM=openblas|eigen overrides.
// With n threads, an Eigen GEMM is split by rows (or columns) over a small pool that blocks
// when idle; each element of C is still computed by one thread over the whole K.
#include <cstdint>

namespace nxd::blas {

// C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C, row-major; op = transpose when trans_*.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
           const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
           int64_t ldc);

enum class Engine { openblas, eigen };
Engine engine();
void set_engine(Engine e);
const char* engine_name(Engine e);

void set_threads(int n);  // compute threads for GEMM (OpenBLAS's pool and nxd's GEMM pool)
int threads();

}  // namespace nxd::blas

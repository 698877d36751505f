#pragma once
// The one place nxd calls BLAS. Row-major GEMM with explicit leading dimensions so strided
// (transposed or sliced) operands are used in place, without copies.
//
// f32 GEMM has two engines. OpenBLAS (cblas_sgemm) and Eigen's GEBP kernel compiled for this
// CPU. When nxd is built with AVX-512 (-march=native on an AVX-512 machine) the default is
// Eigen: Debian's OpenBLAS 0.3.21 runs its Haswell (AVX2) kernel on machines where
// OPENBLAS_CORETYPE=Haswell is forced (as on our CI), and Eigen's AVX-512 kernel measured ~1.45x
// faster on every transformer shape (see bench/matmul). NXD_GEMM=openblas|eigen overrides.
// With n threads, an Eigen GEMM is split over the compute pool by whole panels of columns (C at
// least twice as wide as tall) or by rows (at least 16 per part, op(B) packed once for all
// parts; gemm_f32.h); each element of C is still computed by one thread over the whole K, exactly
// as in the unsplit product, so results do not depend on the thread count.
//
// Matmul precision. With MatmulPrecision::bf16, sgemm keeps f32 operands and result but rounds
// the inputs of the product to bf16 (round to nearest even, as bf16::from_f32) and accumulates in
// f32: what neuronx-cc does by default on a NeuronCore (--auto-cast matmult --auto-cast-type
// bf16) and PyTorch's set_float32_matmul_precision("medium"). Kernels: AMX tiles (Sapphire Rapids
// and later), AVX512-BF16 dot products (Cooper Lake, Zen 4), or the portable one (round the
// operands into f32 scratch over the compute pool, then the f32 engine; also the reference for
// the rounding). The default is AMX where available, else portable (which measured faster than
// avx512_bf16 on an AVX512-BF16 machine without AMX; see blas.cpp); NXD_BF16_KERNEL=amx|
// avx512_bf16|portable overrides it. AMX and AVX512-BF16 treat bf16 subnormal inputs as zero, and
// their results do not depend on the thread count; portable inherits the f32 engine's behaviour.
// dgemm is never affected.
#include <cstdint>
#include <optional>
#include <string_view>

#include "nxd/runtime/dtype.h"

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

// When a product is split over the compute pool (f32 on the Eigen engine; every kernel of the
// bf16 matmul precision): only if m·n·k >= min_work · threads, i.e. each part keeps at least
// min_work multiply-adds to pay for handing it to a helper. f32_min_work applies to fp32
// products, bf16_min_work to products under MatmulPrecision::bf16. The defaults are measured on
// the reference machine (nxd-bench-matmul --threads 2 --split-sweep; docs/design/runtime.md "GEMM
// engine"): at f32 splitting pays from 64^3 (2^18, 1.24x), at bf16 (portable kernel) from
// 256x128x128 (2^22, 1.08x). Where a product is split never changes which dot products compute a
// C element (each is one dot product over the whole K).
struct GemmSplitOptions {
  int64_t f32_min_work = int64_t{1} << 17;
  int64_t bf16_min_work = int64_t{1} << 21;
};
GemmSplitOptions gemm_split();
void set_gemm_split(const GemmSplitOptions& o);  // process-wide; throws if a value is < 0

// Stops OpenBLAS's worker pool if it runs (the pthread build; a no-op for other BLAS builds).
// An idle OpenBLAS worker busy-waits about 0.1 s after every multi-threaded call before it
// sleeps, taking a core from whatever runs next. nxd stops the pool at load and in set_threads
// unless the f32 engine is OpenBLAS with more than one thread; OpenBLAS starts it again on its
// next multi-threaded call. Benches call this after timing raw cblas_* so the spin does not run
// into the next measurement. Not while another thread is inside OpenBLAS.
void stop_openblas_pool();

enum class MatmulPrecision { fp32, bf16 };
void set_matmul_precision(MatmulPrecision p);  // process-wide, like the engine; default fp32
MatmulPrecision matmul_precision();
const char* matmul_precision_name(MatmulPrecision p);  // "fp32", "bf16"
// "fp32" (also "f32", "float32", PyTorch's "highest") or "bf16" (also PyTorch's "medium").
std::optional<MatmulPrecision> parse_matmul_precision(std::string_view s);

// The dtype a product of `t` tensors is computed in: bf16 for f32 tensors under
// MatmulPrecision::bf16, else `t`. The sim device charges matmul FLOPs at this dtype's peak (a
// NeuronCore auto-casting matmuls runs them at its bf16 rate).
inline DType matmul_compute_dtype(DType t) {
  return t == DType::f32 && matmul_precision() == MatmulPrecision::bf16 ? DType::bf16 : t;
}

// Sets the precision for its lifetime and restores the previous one.
class MatmulPrecisionScope {
 public:
  explicit MatmulPrecisionScope(MatmulPrecision p) : prev_(matmul_precision()) {
    set_matmul_precision(p);
  }
  ~MatmulPrecisionScope() { set_matmul_precision(prev_); }
  MatmulPrecisionScope(const MatmulPrecisionScope&) = delete;
  MatmulPrecisionScope& operator=(const MatmulPrecisionScope&) = delete;

 private:
  MatmulPrecision prev_;
};

enum class Bf16Kernel { amx, avx512_bf16, portable };
Bf16Kernel bf16_kernel();                    // the one in use (best available by default)
bool bf16_kernel_available(Bf16Kernel k);    // cpuid + (for AMX) the OS permission
void set_bf16_kernel(Bf16Kernel k);          // throws InvalidArgument naming k if unavailable
const char* bf16_kernel_name(Bf16Kernel k);  // "amx", "avx512_bf16", "portable"

}  // namespace nxd::blas

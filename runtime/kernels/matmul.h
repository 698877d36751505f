#pragma once
// Matrix products through BLAS (runtime/blas.h). Operands may be any strided views: a 2-D
// operand whose inner stride is 1 goes to BLAS as is, one whose outer stride is 1 (a transposed
// view) goes as a trans flag; only other layouts are copied. f32 and f64 call sgemm/dgemm; bf16
// is converted to f32, multiplied, and the result rounded once. A meta output computes nothing
// but charges the cost.
#include "nxd/runtime/tensor.h"

namespace nxd::kernels {

// c[m,n] = alpha * a[m,k] @ b[k,n] + beta * c.
void gemm(const Tensor& c, const Tensor& a, const Tensor& b, double alpha = 1.0, double beta = 0.0);

// c[C..., m, n] = alpha * sum over reduced batch dims of a[A..., m, k] @ b[B..., k, n]
//                 + beta * c.
// The batch shapes A and B broadcast (torch.matmul) to a full batch shape F; c's batch shape C
// must broadcast to F, and the products of batch entries that C does not have (missing or size-1
// dims) are summed into c (this is how a backward reduces a broadcast operand's gradient).
// A shared b (no batch) folds the batch into one gemm when a and c allow it, and a summed batch
// folds into the inner dimension when a and b allow it.
void bmm(const Tensor& c, const Tensor& a, const Tensor& b, double alpha = 1.0, double beta = 0.0);

// The output shape of torch.matmul(a, b) (1-D operands included); throws ShapeError naming both.
Shape matmul_shape(const Shape& a, const Shape& b);

namespace ref {
// Naive triple loops in double; same contracts, except that operands may differ in dtype.
void gemm(const Tensor& c, const Tensor& a, const Tensor& b, double alpha = 1.0, double beta = 0.0);
void bmm(const Tensor& c, const Tensor& a, const Tensor& b, double alpha = 1.0, double beta = 0.0);
}  // namespace ref

}  // namespace nxd::kernels

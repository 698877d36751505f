#pragma once
// Reductions: sum, mean and max along dims, and sum_to (a gradient summed down to an input's
// broadcast shape). f32 and f64 accumulate in their own type (contiguous runs vectorized through
// Eigen); bf16 accumulates in f32 and rounds once. A meta output computes nothing but charges.
#include <cstdint>
#include <vector>

#include "nxd/runtime/tensor.h"

namespace nxd::kernels {

// The shape left after reducing `dims` of `s` (empty dims = all): removed, or 1 when keepdim.
// Throws ShapeError naming `op` for an out-of-range or repeated dim.
Shape reduced_shape(const Shape& s, const std::vector<int64_t>& dims, bool keepdim, const char* op);

// out[reduced_shape(x, dims, keepdim)] = scale * sum of x[S] over dims.
void sum(const Tensor& out, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim,
         double scale = 1.0);
// out = sum / (number of elements reduced).
void mean(const Tensor& out, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);

// out[R] = beta * out + scale * (x[S] summed over the dims that broadcasting R to S added or
// expanded), where R broadcasts to S. The reduction of an elementwise op's backward.
void sum_to(const Tensor& out, const Tensor& x, double scale = 1.0, double beta = 0.0);

// out[reduced_shape(x, {dim}, keepdim)] = max of x along dim; indices (i64, same shape, may be
// undefined) get the position of the first maximum. NaN propagates (a NaN is the maximum).
void amax(const Tensor& out, const Tensor& indices, const Tensor& x, int64_t dim, bool keepdim);

namespace ref {
// Loops in double; same contracts.
void sum(const Tensor& out, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim,
         double scale = 1.0);
void sum_to(const Tensor& out, const Tensor& x, double scale = 1.0, double beta = 0.0);
void amax(const Tensor& out, const Tensor& indices, const Tensor& x, int64_t dim, bool keepdim);
}  // namespace ref

}  // namespace nxd::kernels

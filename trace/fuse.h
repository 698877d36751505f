#pragma once
// The fusion pass (compile.h's "fuse"; "--no-fuse" turns it off). One pattern today:
//   %y = linear(x, w, b); %z = add(%y, r)  (or add(r, %y))  ->  %z = linear_add(x, w, b, r)
// when %y is read only by that add, is no output and has no views, and r has %y's shape and
// dtype: the residual is copied into the output (with the bias added) and the GEMM accumulates
// onto it (beta = 1), saving one write and one read of the activation. The fused node sits
// where the add was. Results differ from the unfused graph by rounding (one rounding of the sum
// instead of two): tested within 1e-6 relative.
#include "nxd/trace/graph.h"

namespace nxd::trace {

// Rewrites g in place; returns the number of fused pairs.
int fuse_linear_residual(Graph& g);
// y = r + b + x @ w^T (b may be undefined), one GEMM accumulating onto r's copy.
Tensor linear_add(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& r);

}  // namespace nxd::trace

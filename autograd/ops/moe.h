#pragma once
// Differentiable ops of mixture-of-experts routing (layers/moe/): top-k selection and the row
// scatter-add that combines the experts' outputs. The row gather is embedding(idx, x) (its
// backward scatter-adds into dx). Not included from autograd/ops.h: #include it where needed.
#include <cstdint>
#include <vector>

#include "nxd/autograd/graph.h"

namespace nxd {

// x [N, E] floating, 1 <= k <= E -> {values [N, k] (x's dtype), indices [N, k] i64}: the k
// largest entries of each row in decreasing order, ties by lower index (torch.topk's values; its
// tie order is unspecified). Backward scatters the values' gradient into zeros of x's shape; the
// indices carry no gradient. A meta x gives meta values and indices.
std::vector<Tensor> topk(const Tensor& x, int64_t k);

// src [M, D] floating, idx [M] i32/i64 with values in [0, n) -> y [n, D], y[idx[i]] += src[i]
// (rows in index order i = 0, 1, ...: deterministic). Backward: dsrc[i] = dy[idx[i]] (a gather).
Tensor scatter_add_rows(const Tensor& src, const Tensor& idx, int64_t n);

// Identity forward; backward multiplies the gradient by `scale` (expert parallelism rescales the
// expert weights' gradients with it).
Tensor scale_grad(const Tensor& x, double scale);

}  // namespace nxd

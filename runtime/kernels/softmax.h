#pragma once
// Softmax and log-softmax over the last dim, forward and backward, optionally scaled and fused
// with a causal mask (the attention kernel uses the row functions directly).
#include <cstdint>

#include "nxd/runtime/tensor.h"

namespace nxd::kernels {

// y, x: [..., R, N] (f32/f64). y = softmax(scale * x) over the last dim. causal: row r of every
// trailing [R, N] block keeps columns j <= r and gets 0 elsewhere (x is not read there).
void softmax_forward(const Tensor& y, const Tensor& x, double scale = 1.0, bool causal = false);
// y, x: [..., N]. y = log_softmax(x) over the last dim.
void log_softmax_forward(const Tensor& y, const Tensor& x);
// dx, dy, y: [..., N] with y = softmax(.): dx = y * (dy - sum(dy * y)) (times `scale` if the
// forward was scaled).
void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, double scale = 1.0);
// dx, dy, y: [..., N] with y = log_softmax(x): dx = dy - exp(y) * sum(dy).
void log_softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y);

// Row building block on contiguous memory: y, x: [rows, n]; y = softmax(scale * x) per row.
// causal: row r keeps columns j <= r % block + offset (offset = n - block aligns the mask to the
// last columns, as for queries that follow cached keys). y may alias x.
template <class T>
void softmax_rows(T* y, const T* x, int64_t rows, int64_t n, T scale, bool causal, int64_t block,
                  int64_t offset = 0);

namespace ref {
void softmax_forward(const Tensor& y, const Tensor& x, double scale = 1.0, bool causal = false);
void log_softmax_forward(const Tensor& y, const Tensor& x);
void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, double scale = 1.0);
void log_softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y);
}  // namespace ref

}  // namespace nxd::kernels

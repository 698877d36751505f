#pragma once
// Differentiable basic ops: elementwise arithmetic with NumPy broadcasting, reductions, matmul,
// and shape ops. Each records its backward when grad mode is on and an input requires grad.
// Floating dtypes f32, f64 and bf16 (bf16 computes in f32 and rounds once). Meta inputs give
// meta outputs of the right shape.
#include <vector>

#include "nxd/autograd/graph.h"

namespace nxd {

// ---- elementwise (broadcasting) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor square(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor pow(const Tensor& a, double exponent);

inline Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
inline Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
inline Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
inline Tensor operator+(const Tensor& a, double s) {
  return add(a, s);
}
inline Tensor operator+(double s, const Tensor& a) {
  return add(a, s);
}
inline Tensor operator-(const Tensor& a, double s) {
  return add(a, -s);
}
inline Tensor operator*(const Tensor& a, double s) {
  return mul(a, s);
}
inline Tensor operator*(double s, const Tensor& a) {
  return mul(a, s);
}
inline Tensor operator/(const Tensor& a, double s) {
  return mul(a, 1.0 / s);
}
inline Tensor operator-(const Tensor& a) {
  return neg(a);
}

// ---- reductions (dims empty = all; negative dims count from the end) ----
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, int64_t dim, bool keepdim = false);  // gradient to the first max
// Sums x down to `shape`, which must broadcast to x's shape (torch's sum_to_size): the reduction
// that a broadcasting op's backward applies. Backward expands.
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- matrix products ----
// torch.matmul semantics: 1-D and 2-D operands, and batched N-D with broadcast batch dims.
// Strided operands (e.g. a transpose view) go to BLAS without copies where BLAS can take them.
Tensor matmul(const Tensor& a, const Tensor& b);
// y[..., out] = x[..., in] @ w[out, in]^T + b[out]  (b may be undefined). One sgemm, no copies.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

// ---- shape ops (differentiable views/copies; see Tensor's raw methods for semantics) ----
Tensor view(const Tensor& x, const Shape& shape);
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int64_t a, int64_t b);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor contiguous(const Tensor& x);
Tensor clone(const Tensor& x);
Tensor to(const Tensor& x, DType dtype);  // gradient converted back to x's dtype
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);

}  // namespace nxd

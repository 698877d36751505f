#pragma once
// Embedding lookup (row gather) and its backward (row scatter-add).
#include "nxd/runtime/tensor.h"

namespace nxd::kernels {

// y: [..., D], ids: [...] i32/i64, weight: [V, D] (any dtype). y[i] = weight[ids[i]]. An id outside
// [0, V) throws naming the id, its position and V.
void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& weight);
// dweight: [V, D] (accumulated into: zero it first for a fresh gradient), dy: [..., D],
// ids: [...]. dweight[ids[i]] += dy[i].
void embedding_backward(const Tensor& dweight, const Tensor& dy, const Tensor& ids);

namespace ref {
void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& weight);
void embedding_backward(const Tensor& dweight, const Tensor& dy, const Tensor& ids);
}  // namespace ref

}  // namespace nxd::kernels

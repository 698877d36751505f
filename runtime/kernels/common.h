#pragma once
// Helpers shared by the kernels: dtype checks, the bf16 -> f32 compute wrapper, and a coalescing
// strided iterator over several operands of the same (broadcast) shape.
#include <array>
#include <cstdint>
#include <vector>

#include "nxd/runtime/context.h"
#include "nxd/runtime/tensor.h"

namespace nxd::kernels {

// Throws "[op] <what> must be f32, f64 or bf16, got i32[..]" unless t is floating.
inline void check_floating(const Tensor& t, const char* op, const char* what) {
  NXD_CHECK(is_floating(t.dtype()), "[", op, "] ", what, " must be f32, f64 or bf16, got ",
            t.desc());
}

// Throws unless a and b have the same dtype.
inline void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  NXD_CHECK(a.dtype() == b.dtype(), "[", op, "] dtypes differ: ", a.desc(), " and ", b.desc());
}

// True if any tensor is meta. A meta output with host inputs is fine (shape-only); a host output
// with a meta input throws naming the op.
inline bool meta_output(const Tensor& out, std::initializer_list<const Tensor*> ins,
                        const char* op) {
  if (out.is_meta()) return true;
  for (const Tensor* t : ins)
    if (t && t->defined() && t->is_meta())
      throw InvalidArgument(
          str("[", op, "] meta input ", t->desc(), " needs a meta output, got ", out.desc()));
  return false;
}

// An f32 working copy of a bf16 tensor (the tensor itself otherwise).
inline Tensor as_compute(const Tensor& t) {
  if (!t.defined() || t.dtype() != DType::bf16) return t;
  return t.detach().to(DType::f32);
}

// Strided iteration over K operands that share `shape` (broadcast operands have stride 0).
// Dims of size 1 are dropped and adjacent dims merged when every operand allows it, so the
// innermost run is as long as possible. f(offsets, n, inner_strides) is called per inner run;
// offsets are in elements from each operand's first element.
template <size_t K, class F>
void for_each_strided(const Shape& shape, const std::array<Shape, K>& strides, F&& f) {
  if (shape_numel(shape) == 0) return;
  Shape sh;
  std::array<Shape, K> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !sh.empty();
    for (size_t k = 0; k < K && merge; ++k) merge = st[k].back() == strides[k][d] * shape[d];
    if (merge) {
      sh.back() *= shape[d];
      for (size_t k = 0; k < K; ++k) st[k].back() = strides[k][d];
    } else {
      sh.push_back(shape[d]);
      for (size_t k = 0; k < K; ++k) st[k].push_back(strides[k][d]);
    }
  }
  std::array<int64_t, K> off{};
  std::array<int64_t, K> inner{};
  if (sh.empty()) {
    for (size_t k = 0; k < K; ++k) inner[k] = 1;
    f(off, int64_t{1}, inner);
    return;
  }
  const int64_t nd = static_cast<int64_t>(sh.size());
  const int64_t n = sh[nd - 1];
  for (size_t k = 0; k < K; ++k) inner[k] = st[k][nd - 1];
  std::vector<int64_t> idx(nd, 0);
  while (true) {
    f(off, n, inner);
    int64_t d = nd - 2;
    for (; d >= 0; --d) {
      ++idx[d];
      for (size_t k = 0; k < K; ++k) off[k] += st[k][d];
      if (idx[d] < sh[d]) break;
      for (size_t k = 0; k < K; ++k) off[k] -= st[k][d] * sh[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// Strides of t broadcast to `shape` (t's shape must broadcast to it): stride 0 on broadcast dims.
inline Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  Shape r(shape.size(), 0);
  const int64_t off = static_cast<int64_t>(shape.size()) - t.dim();
  for (int64_t d = 0; d < t.dim(); ++d)
    r[d + off] = t.shape()[d] == 1 && shape[d + off] != 1 ? 0 : t.strides()[d];
  return r;
}

}  // namespace nxd::kernels

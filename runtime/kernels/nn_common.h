#pragma once
// Internal helpers shared by the neural-network kernels (runtime/kernels/*.cpp only; not
// installed API): float dispatch, argument checks, Eigen maps, GEMM over float/double.
#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/tensor.h"

namespace nxd::kernels::detail {

// Calls f.template operator()<T>() with T = float or double; other dtypes throw naming `op`.
template <class F>
decltype(auto) dispatch_float(const char* op, const Tensor& t, F&& f) {
  if (t.dtype() == DType::f32) return f.template operator()<float>();
  if (t.dtype() == DType::f64) return f.template operator()<double>();
  throw InvalidArgument(str("[", op, "] kernel takes f32 or f64, got ", t.desc(),
                            " (bf16 is converted to f32 by the op)"));
}

template <class T>
using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
template <class T>
using ArrMap = Eigen::Map<Arr<T>>;
template <class T>
using CArrMap = Eigen::Map<const Arr<T>>;

// Sum of p[0, n) in an order fixed by n alone, never by the address: kLanes partial sums over
// i mod kLanes (vectorizable), combined pairwise, then the tail in order. Use it instead of
// Eigen's .sum() on a Map: Eigen's vectorized reduction of a direct-access Map peels scalars up
// to the first aligned packet, so the same values at differently aligned addresses (a std::vector
// scratch, a view at an offset) round differently and break bitwise determinism. (.sum() of an
// expression such as (a * b).sum() has no direct access and always starts at index 0.)
template <class T>
T sum_of(const T* p, int64_t n) {
  constexpr int64_t kLanes = 16;
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += p[i + l];
  for (int64_t w = kLanes / 2; w > 0; w /= 2)
    for (int64_t l = 0; l < w; ++l) acc[l] += acc[l + w];
  T s = acc[0];
  for (; i < n; ++i) s += p[i];
  return s;
}

// dst[0, n) = expr(j, w) for the blocks [j, j + w) of kAssignBlock elements, each evaluated into
// an aligned L1 scratch and copied out. Use it to write an Eigen expression with a vectorized
// transcendental function (exp, log, tanh, erf, logistic) into memory of unknown alignment: Eigen
// computes the elements before its destination's first aligned packet with the scalar function,
// which rounds differently from the vectorized one, so assigning straight into a tensor row makes
// the result depend on the row's address. Here every block starts aligned: which elements take
// the scalar path (a block's last w mod packet) depends on n alone. expr(j, w) returns the
// expression for elements [j, j + w) (elementwise: a block reads only its own elements, so dst
// may be one of its operands).
inline constexpr int64_t kAssignBlock = 512;
template <class T, class Expr>
void assign_blocks(T* dst, int64_t n, Expr&& expr) {
  alignas(64) T buf[kAssignBlock];
  for (int64_t j = 0; j < n; j += kAssignBlock) {
    const int64_t w = std::min(kAssignBlock, n - j);
    Eigen::Map<Arr<T>, Eigen::AlignedMax>(buf, w) = expr(j, w);
    std::copy(buf, buf + w, dst + j);
  }
}

// A contiguous input handle (copies only when x is strided).
inline Tensor in(const Tensor& x) {
  return x.detach().contiguous();
}

inline void check_out(const char* op, const Tensor& y, const Shape& shape, DType dtype) {
  NXD_CHECK_SHAPE(y.shape() == shape, "[", op, "] output is ", y.desc(), ", expected ",
                  dtype_name(dtype), shape_str(shape));
  NXD_CHECK(y.dtype() == dtype, "[", op, "] output is ", y.desc(), ", expected dtype ",
            dtype_name(dtype));
  NXD_CHECK(y.is_meta() || y.is_contiguous(), "[", op, "] output ", y.desc(),
            " must be contiguous");
}

inline void check_same(const char* op, const char* what, const Tensor& a, const Tensor& ref) {
  NXD_CHECK_SHAPE(a.shape() == ref.shape(), "[", op, "] ", what, " is ", a.desc(),
                  ", expected shape ", shape_str(ref.shape()));
  NXD_CHECK(a.dtype() == ref.dtype(), "[", op, "] ", what, " is ", a.desc(), ", expected dtype ",
            dtype_name(ref.dtype()));
}

// True when the kernel should only charge (its output is meta); a meta input with a host output
// is an error.
inline bool meta_only(const char* op, const Tensor& out, std::initializer_list<Tensor> ins) {
  if (out.is_meta()) return true;
  for (const Tensor& t : ins)
    NXD_CHECK(!t.defined() || !t.is_meta(), "[", op, "] meta input ", t.desc(),
              " with a host output ", out.desc());
  return false;
}

inline int64_t last_dim(const Tensor& x) {
  return x.dim() == 0 ? 1 : x.size(-1);
}
inline int64_t rows_of(const Tensor& x) {
  int64_t n = last_dim(x);
  return n == 0 ? 0 : x.numel() / n;
}

// How gemm reads an operand: as stored, or transposed (BLAS's 'N' and 'T').
enum class Trans { no, yes };

// C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C (blas::sgemm / dgemm, row-major).
template <class T>
inline void gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                 int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const bool trans_a = ta == Trans::yes, trans_b = tb == Trans::yes;
  if constexpr (std::is_same_v<T, float>)
    blas::sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    blas::dgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace nxd::kernels::detail

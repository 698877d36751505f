#pragma once
// Internal helpers of the attention kernels (attention.cpp, flash_attention.cpp; not installed
// API): argument checks, strided [B, H, S, D] operands as BLAS sees them, the unit loop.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "nxd/runtime/kernels/nn_common.h"
#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::kernels::detail {

struct Dims {
  int64_t b, hq, hkv, sq, sk, d, group;
  double scale;
  int64_t window = 0;  // causal sliding window: query at key position p sees (p - window, p]
};

inline Dims check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                            bool causal, double scale) {
  NXD_CHECK_SHAPE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "[", op,
                  "] expects q [B,Hq,S,D], k and v [B,Hkv,S,D], got q=", q.desc(), " k=", k.desc(),
                  " v=", v.desc());
  NXD_CHECK_SHAPE(k.shape() == v.shape(), "[", op, "] k and v differ: k=", k.desc(),
                  " v=", v.desc());
  NXD_CHECK_SHAPE(q.size(0) == k.size(0) && q.size(3) == k.size(3), "[", op,
                  "] batch or head dim differ: q=", q.desc(), " k=", k.desc());
  NXD_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), "[", op,
            "] dtypes differ: q=", q.desc(), " k=", k.desc(), " v=", v.desc());
  Dims d{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), 1, scale};
  NXD_CHECK_SHAPE(d.hkv > 0 && d.hq % d.hkv == 0, "[", op, "] kv heads ", d.hkv,
                  " do not divide query heads ", d.hq, ": q=", q.desc(), " k=", k.desc());
  NXD_CHECK_SHAPE(!causal || d.sk >= d.sq, "[", op, "] causal attention needs at least as many ",
                  "keys as queries: q=", q.desc(), " k=", k.desc());
  d.group = d.hq / d.hkv;
  if (!(d.scale > 0)) d.scale = 1.0 / std::sqrt(double(d.d));
  return d;
}

// A sliding window (0: none) is a causal mask's: window >= 0, and causal when positive.
inline int64_t check_window(const char* op, bool causal, int64_t window) {
  NXD_CHECK(window >= 0 && (window == 0 || causal), "[", op, "] sliding window ", window,
            " must be >= 0 and needs causal attention (causal=", causal, ")");
  return window;
}

// A [B, H, S, D] operand BLAS can read per (b, h) with leading dimension ld.
template <class T>
struct Mat {
  T* p;
  int64_t sb, sh, ld;
  T* at(int64_t b, int64_t h) const { return p + b * sb + h * sh; }
};

inline bool gemmable(const Tensor& t) {
  return (t.size(3) <= 1 || t.stride(3) == 1) && (t.size(2) <= 1 || t.stride(2) >= t.size(3));
}
inline Tensor gemm_input(const Tensor& t) {
  Tensor d = t.detach();
  return gemmable(d) ? d : d.contiguous();
}
template <class T>
Mat<T> mat(const Tensor& t) {
  int64_t ld = t.size(2) <= 1 ? std::max<int64_t>(t.size(3), 1) : t.stride(2);
  return {static_cast<T*>(t.raw_data()), t.stride(0), t.stride(1), ld};
}
inline void check_out4(const char* op, const char* what, const Tensor& t, const Shape& shape,
                       DType dtype) {
  NXD_CHECK_SHAPE(t.shape() == shape && t.dtype() == dtype, "[", op, "] ", what, " is ", t.desc(),
                  ", expected ", dtype_name(dtype), shape_str(shape));
  NXD_CHECK(t.is_meta() || gemmable(t), "[", op, "] ", what, " ", t.desc(),
            " needs a unit last stride");
}

// What every attention backward checks of its operands: dq, dk and dv shaped as q, k and v in q's
// dtype with a unit last stride, dout and out as q, and the tensor the forward saved for it
// (`saved_what`: probs or lse) defined, of `saved_shape`, in q's dtype.
struct BackwardOperands {
  const Tensor &dq, &dk, &dv, &dout, &q, &k, &v, &out, &saved;
  const char* saved_what;
  Shape saved_shape;
};
inline void check_backward(const char* op, const BackwardOperands& a) {
  check_out4(op, "dq", a.dq, a.q.shape(), a.q.dtype());
  check_out4(op, "dk", a.dk, a.k.shape(), a.q.dtype());
  check_out4(op, "dv", a.dv, a.v.shape(), a.q.dtype());
  check_same(op, "dout", a.dout, a.q);
  check_same(op, "out", a.out, a.q);
  NXD_CHECK_SHAPE(
      a.saved.defined() && a.saved.shape() == a.saved_shape && a.saved.dtype() == a.q.dtype(), "[",
      op, "] ", a.saved_what, " is ", a.saved.defined() ? a.saved.desc() : "undefined",
      ", expected ", dtype_name(a.q.dtype()), shape_str(a.saved_shape));
}

// fn(begin, end) over [0, n) independent (batch, head) units of about `cost` flops each. f32 runs
// the units on the compute pool (the GEMMs inside run serially, as they do for these sizes
// anyway, so the results do not depend on the thread count); f64 (gradcheck, OpenBLAS) stays on
// the calling thread.
template <class T, class F>
void for_units(int64_t n, double cost, F&& fn) {
  if constexpr (std::is_same_v<T, float>)
    for_rows(n, static_cast<int64_t>(std::min(cost, 1e12)), fn);
  else
    fn(int64_t{0}, n);
}

}  // namespace nxd::kernels::detail

#include "nxd/runtime/kernels/matmul.h"

#include <algorithm>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/kernels/common.h"
#include "nxd/runtime/kernels/gemv_bf16.h"

namespace nxd::kernels {

namespace {

// How BLAS sees one row-major matrix [rows, cols] with strides (s0, s1).
struct Layout {
  bool ok = false;
  bool trans = false;
  int64_t ld = 1;
};

Layout blas_layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1) {
  Layout l;
  const int64_t r1 = std::max<int64_t>(rows, 1), c1 = std::max<int64_t>(cols, 1);
  // Row-major as stored: unit inner stride, row stride >= row length (sizes 1 make a stride moot).
  int64_t e1 = cols == 1 ? 1 : s1, e0 = rows == 1 ? c1 : s0;
  if (e1 == 1 && e0 >= c1) {
    l.ok = true;
    l.ld = e0;
    return l;
  }
  // A transposed view: unit outer stride.
  e0 = rows == 1 ? 1 : s0;
  e1 = cols == 1 ? r1 : s1;
  if (e0 == 1 && e1 >= r1) {
    l.ok = l.trans = true;
    l.ld = e1;
  }
  return l;
}

Layout layout_of(const Tensor& t) {
  const int64_t d = t.dim();
  return blas_layout(t.shape()[d - 2], t.shape()[d - 1], t.strides()[d - 2], t.strides()[d - 1]);
}

// c = alpha * op(a) @ op(b) + beta * c for raw matrices with BLAS layouts; c may be transposed
// (then C^T = op(b)^T @ op(a)^T is computed instead).
template <class T>
void gemm_raw(T* c, Layout lc, const T* a, Layout la, const T* b, Layout lb, int64_t m, int64_t n,
              int64_t k, double alpha, double beta) {
  auto call = [&](bool ta, bool tb, int64_t mm, int64_t nn, const T* x, int64_t ldx, const T* y,
                  int64_t ldy) {
    if constexpr (std::is_same_v<T, float>)
      blas::sgemm(ta, tb, mm, nn, k, static_cast<float>(alpha), x, ldx, y, ldy,
                  static_cast<float>(beta), c, lc.ld);
    else
      blas::dgemm(ta, tb, mm, nn, k, alpha, x, ldx, y, ldy, beta, c, lc.ld);
  };
  if (!lc.trans)
    call(la.trans, lb.trans, m, n, a, la.ld, b, lb.ld);
  else
    call(!lb.trans, !la.trans, n, m, b, lb.ld, a, la.ld);
}

// c *= beta over any strides (beta == 0 writes zeros, ignoring NaNs in c).
void scale_(const Tensor& c, double beta) {
  if (beta == 1.0 || c.numel() == 0) return;
  if (beta == 0.0) {
    c.zero_();
    return;
  }
  dispatch(c.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      T* p = c.data<T>();
      const T s = static_cast<T>(beta);
      for_each_strided<1>(
          c.shape(), {c.strides()},
          [&](const std::array<int64_t, 1>& o, int64_t n, const std::array<int64_t, 1>& st) {
            for (int64_t i = 0; i < n; ++i) p[o[0] + i * st[0]] *= s;
          });
    } else {
      throw InternalError("[matmul] scale_ on a non-f32/f64 tensor");
    }
  });
}

// Merges dims (sizes[i], strides[i]) listed outer to inner into one (size, stride) if they form
// a single arithmetic progression; size-1 dims are ignored.
bool merge_dims(const std::vector<std::pair<int64_t, int64_t>>& dims, int64_t& size,
                int64_t& stride) {
  size = 1;
  stride = 1;
  bool have = false;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    auto [sz, st] = *it;
    if (sz == 1) continue;
    if (!have) {
      stride = st;
      have = true;
    } else if (st != stride * size) {
      return false;
    }
    size *= sz;
  }
  return true;
}

Shape batch_of(const Tensor& t) {
  return Shape(t.shape().begin(), t.shape().end() - 2);
}

void check_operands(const Tensor& c, const Tensor& a, const Tensor& b, const char* op,
                    bool same_dtype = true) {
  check_floating(a, op, "a");
  if (same_dtype) {
    check_same_dtype(a, b, op);
    check_same_dtype(a, c, op);
  }
  NXD_CHECK_SHAPE(a.dim() >= 2 && b.dim() >= 2 && c.dim() >= 2, "[", op,
                  "] operands need >= 2 dims: c=", c.desc(), " a=", a.desc(), " b=", b.desc());
  NXD_CHECK_SHAPE(a.size(-1) == b.size(-2), "[", op, "] inner dims differ: a=", a.desc(),
                  " b=", b.desc());
  NXD_CHECK_SHAPE(c.size(-2) == a.size(-2) && c.size(-1) == b.size(-1), "[", op, "] output ",
                  c.desc(), " does not match a=", a.desc(), " b=", b.desc());
}

// The full batch shape F (A and B broadcast); checks that c's batch broadcasts to F.
Shape full_batch(const Tensor& c, const Tensor& a, const Tensor& b, const char* op) {
  Shape f = broadcast_shapes(batch_of(a), batch_of(b), op);
  Shape cb = batch_of(c);
  bool ok = cb.size() <= f.size();
  for (size_t i = 0; ok && i < cb.size(); ++i) {
    int64_t fd = f[f.size() - cb.size() + i];
    ok = cb[i] == fd || cb[i] == 1;
  }
  NXD_CHECK_SHAPE(ok, "[", op, "] output ", c.desc(), " batch does not broadcast to ", shape_str(f),
                  " of a=", a.desc(), " b=", b.desc());
  return f;
}

template <class T>
void bmm_typed(const Tensor& c_in, Tensor a, Tensor b, double alpha, double beta, const Shape& f) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const int64_t nb = shape_numel(f);
  const int64_t nd = static_cast<int64_t>(f.size());
  const bool reduce = shape_numel(batch_of(c_in)) != nb;
  const bool a_full = shape_numel(batch_of(a)) == nb, b_full = shape_numel(batch_of(b)) == nb;
  Layout la = layout_of(a), lb = layout_of(b), lc = layout_of(c_in);

  // Fold 1: a shared b and no reduction -> one gemm with the batch merged into m.
  if (shape_numel(batch_of(b)) == 1 && !reduce && a_full && nb > 1) {
    std::vector<std::pair<int64_t, int64_t>> ad, cd;
    for (int64_t d = 0; d < a.dim() - 1; ++d) ad.emplace_back(a.shape()[d], a.strides()[d]);
    for (int64_t d = 0; d < c_in.dim() - 1; ++d)
      cd.emplace_back(c_in.shape()[d], c_in.strides()[d]);
    int64_t am, as0, cm, cs0;
    if (merge_dims(ad, am, as0) && merge_dims(cd, cm, cs0)) {
      Layout fa = blas_layout(am, k, as0, a.stride(-1));
      Layout fc = blas_layout(cm, n, cs0, c_in.stride(-1));
      if (fa.ok && fc.ok && lb.ok) {
        gemm_raw<T>(c_in.data<T>(), fc, a.data<T>(), fa, b.data<T>(), lb, am, n, k, alpha, beta);
        return;
      }
    }
  }
  // Fold 2: everything summed into one c -> one gemm with the batch merged into k.
  if (shape_numel(batch_of(c_in)) == 1 && a_full && b_full && nb > 1) {
    std::vector<std::pair<int64_t, int64_t>> ad, bd;
    for (int64_t d = 0; d < a.dim() - 2; ++d) ad.emplace_back(a.shape()[d], a.strides()[d]);
    ad.emplace_back(k, a.stride(-1));
    for (int64_t d = 0; d < b.dim() - 2; ++d) bd.emplace_back(b.shape()[d], b.strides()[d]);
    bd.emplace_back(k, b.stride(-2));
    int64_t ak, ask, bk, bsk;
    if (merge_dims(ad, ak, ask) && merge_dims(bd, bk, bsk) && lc.ok) {
      Layout fa = blas_layout(m, ak, a.stride(-2), ask);
      Layout fb = blas_layout(bk, n, bsk, b.stride(-1));
      if (fa.ok && fb.ok) {
        gemm_raw<T>(c_in.data<T>(), lc, a.data<T>(), fa, b.data<T>(), fb, m, n, ak, alpha, beta);
        return;
      }
    }
  }

  // General: one gemm per batch entry; copies only for layouts BLAS cannot take.
  if (!la.ok) {
    a = a.contiguous();
    la = layout_of(a);
  }
  if (!lb.ok) {
    b = b.contiguous();
    lb = layout_of(b);
  }
  Tensor c = c_in;
  if (!lc.ok) {
    c = beta == 0.0 ? empty(c_in.shape(), c_in.dtype()) : c_in.contiguous();
    lc = layout_of(c);
  }
  if (reduce) {
    scale_(c, beta);
    beta = 1.0;
  }
  Shape fs(f.size() + 2, 1);
  std::copy(f.begin(), f.end(), fs.begin());
  Shape sa = broadcast_strides(a, fs), sb = broadcast_strides(b, fs), sc = broadcast_strides(c, fs);
  sa.resize(nd);
  sb.resize(nd);
  sc.resize(nd);
  const T* ap = a.data<T>();
  const T* bp = b.data<T>();
  T* cp = c.data<T>();
  for_each_strided<3>(
      f, {sa, sb, sc},
      [&](const std::array<int64_t, 3>& o, int64_t cnt, const std::array<int64_t, 3>& st) {
        for (int64_t i = 0; i < cnt; ++i)
          gemm_raw<T>(cp + o[2] + i * st[2], lc, ap + o[0] + i * st[0], la, bp + o[1] + i * st[1],
                      lb, m, n, k, alpha, beta);
      });
  if (!c.is_same(c_in)) c_in.copy_(c);
}

}  // namespace

Shape matmul_shape(const Shape& a, const Shape& b) {
  NXD_CHECK_SHAPE(!a.empty() && !b.empty(),
                  "[matmul] needs at least 1-D operands, got a=", shape_str(a),
                  " b=", shape_str(b));
  Shape a2 = a.size() == 1 ? Shape{1, a[0]} : a;
  Shape b2 = b.size() == 1 ? Shape{b[0], 1} : b;
  NXD_CHECK_SHAPE(a2.back() == b2[b2.size() - 2], "[matmul] inner dims differ: a=", shape_str(a),
                  " b=", shape_str(b));
  Shape f =
      broadcast_shapes(Shape(a2.begin(), a2.end() - 2), Shape(b2.begin(), b2.end() - 2), "matmul");
  if (a.size() > 1) f.push_back(a2[a2.size() - 2]);
  if (b.size() > 1) f.push_back(b2.back());
  return f;
}

void gemm(const Tensor& c, const Tensor& a, const Tensor& b, double alpha, double beta) {
  NXD_CHECK_SHAPE(a.dim() == 2 && b.dim() == 2 && c.dim() == 2,
                  "[gemm] operands must be 2-D: c=", c.desc(), " a=", a.desc(), " b=", b.desc());
  bmm(c, a, b, alpha, beta);
}

void bmm(const Tensor& c, const Tensor& a, const Tensor& b, double alpha, double beta) {
  check_operands(c, a, b, "matmul");
  Shape f = full_batch(c, a, b, "matmul");
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const double flops = 2.0 * static_cast<double>(shape_numel(f)) * m * n * k;
  charge_compute("matmul", flops, static_cast<double>(a.nbytes() + b.nbytes() + c.nbytes()),
                 blas::matmul_compute_dtype(c.dtype()));
  if (meta_output(c, {&a, &b}, "matmul")) return;
  if (c.numel() == 0) return;
  Tensor ad = a.detach(), bd = b.detach(), cd = c.detach();
  if (shape_numel(f) == 0 || k == 0) {
    if (cd.dtype() == DType::bf16) {
      Tensor t = cd.to(DType::f32);
      scale_(t, beta);
      cd.copy_(t);
    } else {
      scale_(cd, beta);
    }
    return;
  }
  switch (c.dtype()) {
    case DType::f32:
      bmm_typed<float>(cd, ad, bd, alpha, beta, f);
      break;
    case DType::f64:
      bmm_typed<double>(cd, ad, bd, alpha, beta, f);
      break;
    case DType::bf16: {
      if (detail::gemv_bf16(cd, ad, bd, alpha, beta)) break;  // a few rows: W read as bf16
      if (detail::gemm_bf16_weight_blocks(cd, ad, bd, alpha, beta)) break;  // W in f32 blocks
      Tensor cf = beta == 0.0 ? empty(cd.shape(), DType::f32) : cd.to(DType::f32);
      bmm_typed<float>(cf, ad.to(DType::f32), bd.to(DType::f32), alpha, beta, f);
      cd.copy_(cf);
      break;
    }
    default:
      throw InternalError("[matmul] unreachable dtype");
  }
}

namespace ref {

void gemm(const Tensor& c, const Tensor& a, const Tensor& b, double alpha, double beta) {
  NXD_CHECK_SHAPE(a.dim() == 2 && b.dim() == 2 && c.dim() == 2,
                  "[ref::gemm] operands must be 2-D: c=", c.desc(), " a=", a.desc(),
                  " b=", b.desc());
  bmm(c, a, b, alpha, beta);
}

void bmm(const Tensor& c, const Tensor& a, const Tensor& b, double alpha, double beta) {
  check_operands(c, a, b, "ref::matmul", /*same_dtype=*/false);
  Shape f = full_batch(c, a, b, "ref::matmul");
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  Shape fa = f, fb = f;
  fa.push_back(m);
  fa.push_back(k);
  fb.push_back(k);
  fb.push_back(n);
  std::vector<double> av = a.detach().expand(fa).to_vector();
  std::vector<double> bv = b.detach().expand(fb).to_vector();
  std::vector<double> cv = c.detach().to_vector();
  for (double& v : cv) v = beta == 0.0 ? 0.0 : beta * v;
  Shape cb = batch_of(c);
  const int64_t nb = shape_numel(f), nd = static_cast<int64_t>(f.size());
  for (int64_t bi = 0; bi < nb; ++bi) {
    // map the full batch index to c's batch index
    int64_t rem = bi, cidx = 0, cmul = 1;
    for (int64_t d = nd - 1; d >= 0; --d) {
      int64_t i = rem % f[d];
      rem /= f[d];
      int64_t cd = d - (nd - static_cast<int64_t>(cb.size()));
      if (cd >= 0) {
        if (cb[cd] != 1) cidx += i * cmul;
        cmul *= cb[cd];
      }
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += av[(bi * m + i) * k + p] * bv[(bi * k + p) * n + j];
        cv[(cidx * m + i) * n + j] += alpha * s;
      }
  }
  c.detach().copy_(from_doubles(cv, c.shape(), DType::f64));
}

}  // namespace ref

}  // namespace nxd::kernels

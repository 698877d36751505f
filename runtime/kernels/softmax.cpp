#include "nxd/runtime/kernels/softmax.h"

#include <cmath>

#include "nxd/runtime/kernels/nn_common.h"

namespace nxd::kernels {

using namespace detail;

template <class T>
void softmax_rows(T* y, const T* x, int64_t rows, int64_t n, T scale, bool causal, int64_t block,
                  int64_t offset) {
  // The exponentials go to an aligned row first: Eigen evaluates the elements before the first
  // aligned packet of its destination with the scalar exp, the rest with the vectorized one (not
  // bitwise equal), so exponentiating in place would make y depend on the address of y (the
  // attention scratch of an eval-mode forward lives wherever malloc puts it).
  Arr<T> e(n);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    int64_t valid = causal ? std::min<int64_t>(r % block + 1 + offset, n) : n;
    CArrMap<T> xv(xr, valid);
    T mx = xv.maxCoeff();
    if (scale == T(1)) {
      e.head(valid) = (xv - mx).exp();
    } else {
      e.head(valid) = ((xv - mx) * scale).exp();
    }
    T inv = T(1) / sum_of(e.data(), valid);
    ArrMap<T>(yr, valid) = e.head(valid) * inv;
    for (int64_t j = valid; j < n; ++j) yr[j] = T(0);
  }
}
template void softmax_rows<float>(float*, const float*, int64_t, int64_t, float, bool, int64_t,
                                  int64_t);
template void softmax_rows<double>(double*, const double*, int64_t, int64_t, double, bool, int64_t,
                                   int64_t);

static void check_scale(const char* op, double scale) {
  NXD_CHECK(scale > 0, "[", op, "] scale must be positive, got ", scale);
}

void softmax_forward(const Tensor& y, const Tensor& x, double scale, bool causal) {
  const char* op = "softmax_forward";
  check_out(op, y, x.shape(), x.dtype());
  check_scale(op, scale);
  NXD_CHECK_SHAPE(!causal || x.dim() >= 2, "[", op, "] causal mask needs [..., R, N], got ",
                  x.desc());
  int64_t n = last_dim(x), rows = rows_of(x);
  charge_compute(op, 4.0 * x.numel(), 2.0 * x.nbytes(), x.dtype());
  if (meta_only(op, y, {x}) || x.numel() == 0) return;
  Tensor xc = in(x);
  int64_t block = causal ? x.size(-2) : 1;
  dispatch_float(op, x, [&]<class T>() {
    softmax_rows<T>(y.data<T>(), xc.data<T>(), rows, n, T(scale), causal, block);
  });
}

void log_softmax_forward(const Tensor& y, const Tensor& x) {
  const char* op = "log_softmax_forward";
  check_out(op, y, x.shape(), x.dtype());
  int64_t n = last_dim(x), rows = rows_of(x);
  charge_compute(op, 4.0 * x.numel(), 2.0 * x.nbytes(), x.dtype());
  if (meta_only(op, y, {x}) || x.numel() == 0) return;
  Tensor xc = in(x);
  dispatch_float(op, x, [&]<class T>() {
    const T* xp = xc.data<T>();
    T* yp = y.data<T>();
    for (int64_t r = 0; r < rows; ++r) {
      CArrMap<T> xv(xp + r * n, n);
      ArrMap<T> yv(yp + r * n, n);
      T mx = xv.maxCoeff();
      yv = xv - mx;
      T lse = std::log(yv.exp().sum());
      yv -= lse;
    }
  });
}

void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, double scale) {
  const char* op = "softmax_backward";
  check_out(op, dx, y.shape(), y.dtype());
  check_same(op, "dy", dy, y);
  int64_t n = last_dim(y), rows = rows_of(y);
  charge_compute(op, 4.0 * y.numel(), 3.0 * y.nbytes(), y.dtype());
  if (meta_only(op, dx, {dy, y}) || y.numel() == 0) return;
  Tensor dyc = in(dy), yc = in(y);
  dispatch_float(op, y, [&]<class T>() {
    const T* dyp = dyc.data<T>();
    const T* yp = yc.data<T>();
    T* dxp = dx.data<T>();
    for (int64_t r = 0; r < rows; ++r) {
      CArrMap<T> g(dyp + r * n, n), p(yp + r * n, n);
      ArrMap<T> d(dxp + r * n, n);
      T dot = (g * p).sum();
      d = (g - dot) * p * T(scale);
    }
  });
}

void log_softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  const char* op = "log_softmax_backward";
  check_out(op, dx, y.shape(), y.dtype());
  check_same(op, "dy", dy, y);
  int64_t n = last_dim(y), rows = rows_of(y);
  charge_compute(op, 4.0 * y.numel(), 3.0 * y.nbytes(), y.dtype());
  if (meta_only(op, dx, {dy, y}) || y.numel() == 0) return;
  Tensor dyc = in(dy), yc = in(y);
  dispatch_float(op, y, [&]<class T>() {
    const T* dyp = dyc.data<T>();
    const T* yp = yc.data<T>();
    T* dxp = dx.data<T>();
    for (int64_t r = 0; r < rows; ++r) {
      CArrMap<T> g(dyp + r * n, n), ly(yp + r * n, n);
      ArrMap<T> d(dxp + r * n, n);
      T s = sum_of(dyp + r * n, n);
      d = g - ly.exp() * s;
    }
  });
}

// ---------------- naive references (double accumulation, scalar loops) ----------------
namespace ref {

template <class F>
static void rows_loop(const Tensor& x, F&& f) {
  int64_t n = last_dim(x), rows = rows_of(x);
  for (int64_t r = 0; r < rows; ++r) f(r, n);
}

void softmax_forward(const Tensor& y, const Tensor& x, double scale, bool causal) {
  Tensor xc = in(x);
  int64_t block = causal ? x.size(-2) : 1;
  dispatch_float("ref::softmax_forward", x, [&]<class T>() {
    const T* xp = xc.data<T>();
    T* yp = y.data<T>();
    rows_loop(x, [&](int64_t r, int64_t n) {
      int64_t valid = causal ? std::min<int64_t>(r % block + 1, n) : n;
      double mx = -INFINITY, s = 0;
      for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, scale * double(xp[r * n + j]));
      for (int64_t j = 0; j < valid; ++j) s += std::exp(scale * double(xp[r * n + j]) - mx);
      for (int64_t j = 0; j < n; ++j)
        yp[r * n + j] = j < valid ? T(std::exp(scale * double(xp[r * n + j]) - mx) / s) : T(0);
    });
  });
}

void log_softmax_forward(const Tensor& y, const Tensor& x) {
  Tensor xc = in(x);
  dispatch_float("ref::log_softmax_forward", x, [&]<class T>() {
    const T* xp = xc.data<T>();
    T* yp = y.data<T>();
    rows_loop(x, [&](int64_t r, int64_t n) {
      double mx = -INFINITY, s = 0;
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, double(xp[r * n + j]));
      for (int64_t j = 0; j < n; ++j) s += std::exp(double(xp[r * n + j]) - mx);
      for (int64_t j = 0; j < n; ++j) yp[r * n + j] = T(double(xp[r * n + j]) - mx - std::log(s));
    });
  });
}

void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, double scale) {
  Tensor dyc = in(dy), yc = in(y);
  dispatch_float("ref::softmax_backward", y, [&]<class T>() {
    const T *g = dyc.data<T>(), *p = yc.data<T>();
    T* d = dx.data<T>();
    rows_loop(y, [&](int64_t r, int64_t n) {
      double dot = 0;
      for (int64_t j = 0; j < n; ++j) dot += double(g[r * n + j]) * p[r * n + j];
      for (int64_t j = 0; j < n; ++j)
        d[r * n + j] = T(scale * double(p[r * n + j]) * (double(g[r * n + j]) - dot));
    });
  });
}

void log_softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  Tensor dyc = in(dy), yc = in(y);
  dispatch_float("ref::log_softmax_backward", y, [&]<class T>() {
    const T *g = dyc.data<T>(), *ly = yc.data<T>();
    T* d = dx.data<T>();
    rows_loop(y, [&](int64_t r, int64_t n) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += g[r * n + j];
      for (int64_t j = 0; j < n; ++j)
        d[r * n + j] = T(double(g[r * n + j]) - std::exp(double(ly[r * n + j])) * s);
    });
  });
}

}  // namespace ref
}  // namespace nxd::kernels

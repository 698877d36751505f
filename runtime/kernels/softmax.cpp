#include "nxd/runtime/kernels/softmax.h"

#include <array>
#include <cmath>
#include <utility>

#include "nxd/runtime/kernels/nn_common.h"
#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::kernels {

using namespace detail;

template <class T>
void softmax_rows(T* y, const T* x, int64_t rows, int64_t n, T scale, bool causal, int64_t block,
                  int64_t offset) {
  for_rows(rows, 4 * n, [&](int64_t r0, int64_t r1) {
    // The exponentials go to an aligned row first: Eigen evaluates the elements before the first
    // aligned packet of its destination with the scalar exp, the rest with the vectorized one
    // (not bitwise equal), so exponentiating in place would make y depend on the address of y
    // (the attention scratch of an eval-mode forward lives wherever malloc puts it).
    Arr<T> e(n);
    for (int64_t r = r0; r < r1; ++r) {
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
  });
}
template void softmax_rows<float>(float*, const float*, int64_t, int64_t, float, bool, int64_t,
                                  int64_t);
template void softmax_rows<double>(double*, const double*, int64_t, int64_t, double, bool, int64_t,
                                   int64_t);

namespace {

void check_scale(const char* op, double scale) {
  NXD_CHECK(scale > 0, "[", op, "] scale must be positive, got ", scale);
}

// The shared body of the row kernels below: y and ins[1..] match ins[0] ([..., N], contiguous
// copies when strided); charges `flops` and `bytes` per element of ins[0]; runs
// body(y, {inputs}, r0, r1, n) over row ranges, in parallel for large inputs.
template <size_t NI, class Body>
void map_rows(const char* op, double flops, double bytes, const Tensor& y,
              const std::array<std::pair<const char*, Tensor>, NI>& ins, Body&& body) {
  const Tensor& x = ins[0].second;
  check_out(op, y, x.shape(), x.dtype());
  for (size_t k = 1; k < NI; ++k) check_same(op, ins[k].first, ins[k].second, x);
  const int64_t n = last_dim(x), rows = rows_of(x);
  charge_compute(op, flops * x.numel(), bytes * x.nbytes(), x.dtype());
  for (const auto& [name, t] : ins)
    if (meta_only(op, y, {t})) return;
  if (x.numel() == 0) return;
  std::array<Tensor, NI> c;
  for (size_t k = 0; k < NI; ++k) c[k] = in(ins[k].second);
  dispatch_float(op, x, [&]<class T>() {
    std::array<const T*, NI> ip;
    for (size_t k = 0; k < NI; ++k) ip[k] = c[k].template data<T>();
    T* yp = y.data<T>();
    for_rows(rows, static_cast<int64_t>(flops) * n,
             [&](int64_t r0, int64_t r1) { body(yp, ip, r0, r1, n); });
  });
}

}  // namespace

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
  map_rows<1>(
      "log_softmax_forward", 4, 2, y, {{{"x", x}}},
      [&]<class T>(T* yp, const std::array<const T*, 1>& xp, int64_t r0, int64_t r1, int64_t n) {
        for (int64_t r = r0; r < r1; ++r) {
          CArrMap<T> xv(xp[0] + r * n, n);
          ArrMap<T> yv(yp + r * n, n);
          T mx = xv.maxCoeff();
          yv = xv - mx;
          T lse = std::log(yv.exp().sum());
          yv -= lse;
        }
      });
}

void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, double scale) {
  map_rows<2>(
      "softmax_backward", 4, 3, dx, {{{"y", y}, {"dy", dy}}},
      [&]<class T>(T* dxp, const std::array<const T*, 2>& in, int64_t r0, int64_t r1, int64_t n) {
        for (int64_t r = r0; r < r1; ++r) {
          CArrMap<T> p(in[0] + r * n, n), g(in[1] + r * n, n);
          T dot = (g * p).sum();
          ArrMap<T>(dxp + r * n, n) = (g - dot) * p * T(scale);
        }
      });
}

void log_softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  map_rows<2>(
      "log_softmax_backward", 4, 3, dx, {{{"y", y}, {"dy", dy}}},
      [&]<class T>(T* dxp, const std::array<const T*, 2>& in, int64_t r0, int64_t r1, int64_t n) {
        for (int64_t r = r0; r < r1; ++r) {
          CArrMap<T> ly(in[0] + r * n, n), g(in[1] + r * n, n);
          T s = sum_of(in[1] + r * n, n);
          assign_blocks(dxp + r * n, n, [&](int64_t j, int64_t w) {
            return g.segment(j, w) - ly.segment(j, w).exp() * s;
          });
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

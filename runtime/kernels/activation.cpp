#include "nxd/runtime/kernels/activation.h"

#include <unsupported/Eigen/SpecialFunctions>

#include <cmath>

#include "nxd/runtime/kernels/nn_common.h"

namespace nxd::kernels {

using namespace detail;

namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1/sqrt(2 pi)
constexpr double kGeluC = 0.044715;
// Elementwise work is done in blocks that stay in L1 and vectorize.
constexpr int64_t kBlock = 2048;

template <class F>
void blocks(int64_t n, F&& f) {
  for (int64_t s = 0; s < n; s += kBlock) f(s, std::min(kBlock, n - s));
}

void check_unary(const char* op, const Tensor& y, const Tensor& x) {
  check_out(op, y, x.shape(), x.dtype());
}

}  // namespace

void gelu_forward(const Tensor& y, const Tensor& x, bool tanh_approx) {
  const char* op = "gelu_forward";
  check_unary(op, y, x);
  charge_compute(op, 10.0 * x.numel(), 2.0 * x.nbytes(), x.dtype());
  if (meta_only(op, y, {x})) return;
  Tensor xc = in(x);
  dispatch_float(op, x, [&]<class T>() {
    const T* xp = xc.data<T>();
    T* yp = y.data<T>();
    blocks(x.numel(), [&](int64_t s, int64_t n) {
      CArrMap<T> xv(xp + s, n);
      ArrMap<T> yv(yp + s, n);
      if (tanh_approx)
        yv = T(0.5) * xv * (T(1) + (T(kSqrt2OverPi) * (xv + T(kGeluC) * xv.cube())).tanh());
      else
        yv = T(0.5) * xv * (T(1) + (xv * T(kInvSqrt2)).erf());
    });
  });
}

void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, bool tanh_approx) {
  const char* op = "gelu_backward";
  check_unary(op, dx, x);
  check_same(op, "dy", dy, x);
  charge_compute(op, 16.0 * x.numel(), 3.0 * x.nbytes(), x.dtype());
  if (meta_only(op, dx, {dy, x})) return;
  Tensor xc = in(x), gc = in(dy);
  dispatch_float(op, x, [&]<class T>() {
    const T *xp = xc.data<T>(), *gp = gc.data<T>();
    T* dp = dx.data<T>();
    Arr<T> t(kBlock);
    blocks(x.numel(), [&](int64_t s, int64_t n) {
      CArrMap<T> xv(xp + s, n), g(gp + s, n);
      ArrMap<T> d(dp + s, n);
      auto tt = t.head(n);
      if (tanh_approx) {
        tt = (T(kSqrt2OverPi) * (xv + T(kGeluC) * xv.cube())).tanh();
        d = g * (T(0.5) * (T(1) + tt) + T(0.5) * xv * (T(1) - tt.square()) * T(kSqrt2OverPi) *
                                            (T(1) + T(3 * kGeluC) * xv.square()));
      } else {
        tt = (xv * T(kInvSqrt2)).erf();
        d = g * (T(0.5) * (T(1) + tt) + xv * (T(-0.5) * xv.square()).exp() * T(kInvSqrt2Pi));
      }
    });
  });
}

void silu_forward(const Tensor& y, const Tensor& x) {
  const char* op = "silu_forward";
  check_unary(op, y, x);
  charge_compute(op, 5.0 * x.numel(), 2.0 * x.nbytes(), x.dtype());
  if (meta_only(op, y, {x})) return;
  Tensor xc = in(x);
  dispatch_float(op, x, [&]<class T>() {
    const T* xp = xc.data<T>();
    T* yp = y.data<T>();
    blocks(x.numel(), [&](int64_t s, int64_t n) {
      CArrMap<T> xv(xp + s, n);
      ArrMap<T>(yp + s, n) = xv / (T(1) + (-xv).exp());
    });
  });
}

void silu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const char* op = "silu_backward";
  check_unary(op, dx, x);
  check_same(op, "dy", dy, x);
  charge_compute(op, 8.0 * x.numel(), 3.0 * x.nbytes(), x.dtype());
  if (meta_only(op, dx, {dy, x})) return;
  Tensor xc = in(x), gc = in(dy);
  dispatch_float(op, x, [&]<class T>() {
    const T *xp = xc.data<T>(), *gp = gc.data<T>();
    T* dp = dx.data<T>();
    Arr<T> sg(kBlock);
    blocks(x.numel(), [&](int64_t s, int64_t n) {
      CArrMap<T> xv(xp + s, n), g(gp + s, n);
      auto sv = sg.head(n);
      sv = T(1) / (T(1) + (-xv).exp());
      ArrMap<T>(dp + s, n) = g * sv * (T(1) + xv * (T(1) - sv));
    });
  });
}

void swiglu_forward(const Tensor& y, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  check_out(op, y, gate.shape(), gate.dtype());
  check_same(op, "up", up, gate);
  charge_compute(op, 6.0 * gate.numel(), 3.0 * gate.nbytes(), gate.dtype());
  if (meta_only(op, y, {gate, up})) return;
  Tensor gc = in(gate), uc = in(up);
  dispatch_float(op, gate, [&]<class T>() {
    const T *gp = gc.data<T>(), *up_ = uc.data<T>();
    T* yp = y.data<T>();
    blocks(gate.numel(), [&](int64_t s, int64_t n) {
      CArrMap<T> gv(gp + s, n), uv(up_ + s, n);
      ArrMap<T>(yp + s, n) = gv / (T(1) + (-gv).exp()) * uv;
    });
  });
}

void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                     const Tensor& up) {
  const char* op = "swiglu_backward";
  if (dgate.defined()) check_out(op, dgate, gate.shape(), gate.dtype());
  if (dup.defined()) check_out(op, dup, gate.shape(), gate.dtype());
  check_same(op, "up", up, gate);
  check_same(op, "dy", dy, gate);
  charge_compute(op, 10.0 * gate.numel(), 5.0 * gate.nbytes(), gate.dtype());
  const Tensor& any = dgate.defined() ? dgate : dup;
  if (!any.defined() || meta_only(op, any, {dy, gate, up})) return;
  Tensor gc = in(gate), uc = in(up), dc = in(dy);
  dispatch_float(op, gate, [&]<class T>() {
    const T *gp = gc.data<T>(), *up_ = uc.data<T>(), *dyp = dc.data<T>();
    T* dgp = dgate.defined() ? dgate.data<T>() : nullptr;
    T* dup_ = dup.defined() ? dup.data<T>() : nullptr;
    Arr<T> sg(kBlock);
    blocks(gate.numel(), [&](int64_t s, int64_t n) {
      CArrMap<T> gv(gp + s, n), uv(up_ + s, n), g(dyp + s, n);
      auto sv = sg.head(n);
      sv = T(1) / (T(1) + (-gv).exp());
      if (dup_) ArrMap<T>(dup_ + s, n) = g * gv * sv;
      if (dgp) ArrMap<T>(dgp + s, n) = g * uv * sv * (T(1) + gv * (T(1) - sv));
    });
  });
}

// ---------------- naive references (scalar, double) ----------------
namespace ref {

namespace {
double gelu_d(double x, bool th) {
  if (th) return 0.5 * x * (1 + std::tanh(kSqrt2OverPi * (x + kGeluC * x * x * x)));
  return 0.5 * x * (1 + std::erf(x * kInvSqrt2));
}
double gelu_grad_d(double x, bool th) {
  if (th) {
    double t = std::tanh(kSqrt2OverPi * (x + kGeluC * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kSqrt2OverPi * (1 + 3 * kGeluC * x * x);
  }
  return 0.5 * (1 + std::erf(x * kInvSqrt2)) + x * std::exp(-0.5 * x * x) * kInvSqrt2Pi;
}
double sig(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

template <class F>
void map_out(const Tensor& out, const std::vector<Tensor>& ins, F&& f) {
  std::vector<std::vector<double>> v;
  for (auto& t : ins) v.push_back(t.to_vector());
  std::vector<double> r(out.numel());
  for (size_t i = 0; i < r.size(); ++i) r[i] = f(v, i);
  out.copy_(from_doubles(r, out.shape(), DType::f64));
}
}  // namespace

void gelu_forward(const Tensor& y, const Tensor& x, bool th) {
  map_out(y, {x}, [&](auto& v, size_t i) { return gelu_d(v[0][i], th); });
}
void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, bool th) {
  map_out(dx, {dy, x}, [&](auto& v, size_t i) { return v[0][i] * gelu_grad_d(v[1][i], th); });
}
void silu_forward(const Tensor& y, const Tensor& x) {
  map_out(y, {x}, [&](auto& v, size_t i) { return v[0][i] * sig(v[0][i]); });
}
void silu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  map_out(dx, {dy, x}, [&](auto& v, size_t i) {
    double s = sig(v[1][i]);
    return v[0][i] * s * (1 + v[1][i] * (1 - s));
  });
}
void swiglu_forward(const Tensor& y, const Tensor& gate, const Tensor& up) {
  map_out(y, {gate, up}, [&](auto& v, size_t i) { return v[0][i] * sig(v[0][i]) * v[1][i]; });
}
void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                     const Tensor& up) {
  if (dgate.defined())
    map_out(dgate, {dy, gate, up}, [&](auto& v, size_t i) {
      double s = sig(v[1][i]);
      return v[0][i] * v[2][i] * s * (1 + v[1][i] * (1 - s));
    });
  if (dup.defined())
    map_out(dup, {dy, gate}, [&](auto& v, size_t i) { return v[0][i] * v[1][i] * sig(v[1][i]); });
}

}  // namespace ref
}  // namespace nxd::kernels

#include "nxd/runtime/kernels/elementwise.h"

#include <Eigen/Core>
#include <cmath>

#include "nxd/runtime/context.h"
#include "nxd/runtime/kernels/common.h"
#include "nxd/runtime/kernels/nn_common.h"
#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::kernels {

const char* unary_name(Unary op) {
  switch (op) {
    case Unary::neg:
      return "neg";
    case Unary::exp:
      return "exp";
    case Unary::log:
      return "log";
    case Unary::sqrt:
      return "sqrt";
    case Unary::rsqrt:
      return "rsqrt";
    case Unary::tanh:
      return "tanh";
    case Unary::sigmoid:
      return "sigmoid";
    case Unary::relu:
      return "relu";
    case Unary::square:
      return "square";
    case Unary::abs:
      return "abs";
    case Unary::pow:
      return "pow";
    case Unary::add_scalar:
      return "add";
    case Unary::mul_scalar:
      return "mul";
  }
  return "unary";
}

const char* binary_name(Binary op) {
  switch (op) {
    case Binary::add:
      return "add";
    case Binary::sub:
      return "sub";
    case Binary::mul:
      return "mul";
    case Binary::div:
      return "div";
    case Binary::maximum:
      return "maximum";
    case Binary::minimum:
      return "minimum";
  }
  return "binary";
}

UnarySaves unary_backward_saves(Unary op) {
  switch (op) {
    case Unary::exp:
    case Unary::sqrt:
    case Unary::rsqrt:
    case Unary::tanh:
    case Unary::sigmoid:
    case Unary::relu:
      return UnarySaves::output;
    case Unary::log:
    case Unary::square:
    case Unary::abs:
    case Unary::pow:
      return UnarySaves::input;
    default:
      return UnarySaves::none;
  }
}

namespace {

// Contiguous operands are processed in blocks of kBlock elements (a multiple of the SIMD width,
// so every block start has the alignment of the first), in parallel for large tensors.
constexpr int64_t kBlock = 4096;

// Rough flops per element, for the cost model.
double unary_flops(Unary op) {
  switch (op) {
    case Unary::exp:
    case Unary::log:
    case Unary::tanh:
    case Unary::sigmoid:
    case Unary::pow:
      return 8;
    case Unary::sqrt:
    case Unary::rsqrt:
      return 2;
    default:
      return 1;
  }
}

void check_broadcasts_to(const Tensor& in, const Tensor& out, const char* op, const char* what) {
  bool ok = in.dim() <= out.dim();
  for (int64_t d = 0; ok && d < in.dim(); ++d) {
    int64_t od = out.shape()[d + out.dim() - in.dim()];
    ok = in.shape()[d] == od || in.shape()[d] == 1;
  }
  NXD_CHECK_SHAPE(ok, "[", op, "] ", what, " ", in.desc(), " does not broadcast to the output ",
                  out.desc());
}

// The scalar function of each op (T = float or double).
template <class T, class Body>
auto with_unary(Unary op, T p, Body&& body) {
  switch (op) {
    case Unary::neg:
      return body([](T v) { return -v; });
    case Unary::exp:
      return body([](T v) { return std::exp(v); });
    case Unary::log:
      return body([](T v) { return std::log(v); });
    case Unary::sqrt:
      return body([](T v) { return std::sqrt(v); });
    case Unary::rsqrt:
      return body([](T v) { return T(1) / std::sqrt(v); });
    case Unary::tanh:
      return body([](T v) { return std::tanh(v); });
    case Unary::sigmoid:
      return body([](T v) { return T(1) / (T(1) + std::exp(-v)); });
    case Unary::relu:
      return body([](T v) { return v > T(0) ? v : T(0); });
    case Unary::square:
      return body([](T v) { return v * v; });
    case Unary::abs:
      return body([](T v) { return std::abs(v); });
    case Unary::pow:
      if (p == T(2)) return body([](T v) { return v * v; });
      if (p == T(1)) return body([](T v) { return v; });
      return body([p](T v) { return std::pow(v, p); });
    case Unary::add_scalar:
      return body([p](T v) { return v + p; });
    case Unary::mul_scalar:
      return body([p](T v) { return v * p; });
  }
  throw InternalError("[unary] bad op");
}

// dy * f'(s), s = x or y as unary_backward_saves says (s unused for linear ops).
template <class T, class Body>
auto with_unary_grad(Unary op, T p, Body&& body) {
  switch (op) {
    case Unary::neg:
      return body([](T g, T) { return -g; });
    case Unary::exp:
      return body([](T g, T y) { return g * y; });
    case Unary::log:
      return body([](T g, T x) { return g / x; });
    case Unary::sqrt:
      return body([](T g, T y) { return g * T(0.5) / y; });
    case Unary::rsqrt:
      return body([](T g, T y) { return g * T(-0.5) * y * y * y; });
    case Unary::tanh:
      return body([](T g, T y) { return g * (T(1) - y * y); });
    case Unary::sigmoid:
      return body([](T g, T y) { return g * y * (T(1) - y); });
    case Unary::relu:
      return body([](T g, T y) { return y > T(0) ? g : T(0); });
    case Unary::square:
      return body([](T g, T x) { return g * T(2) * x; });
    case Unary::abs:
      return body([](T g, T x) { return x > T(0) ? g : (x < T(0) ? -g : T(0)); });
    case Unary::pow:
      if (p == T(2)) return body([](T g, T x) { return g * T(2) * x; });
      if (p == T(1)) return body([](T g, T) { return g; });
      return body([p](T g, T x) { return g * p * std::pow(x, p - T(1)); });
    case Unary::add_scalar:
      return body([](T g, T) { return g; });
    case Unary::mul_scalar:
      return body([p](T g, T) { return g * p; });
  }
  throw InternalError("[unary_backward] bad op");
}

template <class T, class Body>
auto with_binary(Binary op, Body&& body) {
  switch (op) {
    case Binary::add:
      return body([](T a, T b) { return a + b; });
    case Binary::sub:
      return body([](T a, T b) { return a - b; });
    case Binary::mul:
      return body([](T a, T b) { return a * b; });
    case Binary::div:
      return body([](T a, T b) { return a / b; });
    case Binary::maximum:
      return body([](T a, T b) { return (a > b || std::isnan(a)) ? a : b; });
    case Binary::minimum:
      return body([](T a, T b) { return (a < b || std::isnan(a)) ? a : b; });
  }
  throw InternalError("[binary] bad op");
}

// out = f(x) over the broadcast shape of out.
template <class T, class F>
void map1(const Tensor& out, const Tensor& x, F f) {
  T* o = out.data<T>();
  const T* xp = x.data<T>();
  if (out.is_contiguous() && x.is_contiguous() && x.numel() == out.numel()) {
    for_blocks(out.numel(), kBlock, 2, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = f(xp[i]);
    });
    return;
  }
  for_each_strided<2>(
      out.shape(), {out.strides(), broadcast_strides(x, out.shape())},
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        T* op = o + off[0];
        const T* ip = xp + off[1];
        if (st[0] == 1 && st[1] == 1) {
          for (int64_t i = 0; i < n; ++i) op[i] = f(ip[i]);
        } else if (st[0] == 1 && st[1] == 0) {
          const T v = f(ip[0]);
          for (int64_t i = 0; i < n; ++i) op[i] = v;
        } else {
          for (int64_t i = 0; i < n; ++i) op[i * st[0]] = f(ip[i * st[1]]);
        }
      });
}

// out = f(a, b) over the broadcast shape of out.
template <class T, class F>
void map2(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  T* o = out.data<T>();
  const T* ap = a.data<T>();
  const T* bp = b.data<T>();
  const int64_t total = out.numel();
  if (out.is_contiguous() && a.is_contiguous() && b.is_contiguous() && a.numel() == total &&
      b.numel() == total) {
    for_blocks(total, kBlock, 2, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = f(ap[i], bp[i]);
    });
    return;
  }
  for_each_strided<3>(
      out.shape(),
      {out.strides(), broadcast_strides(a, out.shape()), broadcast_strides(b, out.shape())},
      [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
        T* op = o + off[0];
        const T* x = ap + off[1];
        const T* y = bp + off[2];
        if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
          for (int64_t i = 0; i < n; ++i) op[i] = f(x[i], y[i]);
        } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {
          const T yv = y[0];
          for (int64_t i = 0; i < n; ++i) op[i] = f(x[i], yv);
        } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {
          const T xv = x[0];
          for (int64_t i = 0; i < n; ++i) op[i] = f(xv, y[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) op[i * st[0]] = f(x[i * st[1]], y[i * st[2]]);
        }
      });
}

// Transcendental ops on contiguous data through Eigen's vectorized exp/log/tanh/logistic (std::
// versions do not vectorize without -ffast-math). Returns false when op has no such path.
template <class T>
bool eigen_unary(const Tensor& out, const Tensor& x, Unary op) {
  if (!(out.is_contiguous() && x.is_contiguous() && x.numel() == out.numel())) return false;
  using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
  switch (op) {
    case Unary::exp:
    case Unary::log:
    case Unary::tanh:
    case Unary::sigmoid:
      break;
    default:
      return false;
  }
  T* op_ = out.data<T>();
  const T* xp = x.data<T>();
  // Through an aligned scratch (detail::assign_blocks): the result must not depend on where the
  // output lies.
  for_blocks(out.numel(), kBlock, 8, [&](int64_t b, int64_t e) {
    Eigen::Map<const Arr> v(xp + b, e - b);
    T* o = op_ + b;
    const int64_t n = e - b;
    if (op == Unary::exp)
      detail::assign_blocks(o, n, [&](int64_t j, int64_t w) { return v.segment(j, w).exp(); });
    else if (op == Unary::log)
      detail::assign_blocks(o, n, [&](int64_t j, int64_t w) { return v.segment(j, w).log(); });
    else if (op == Unary::tanh)
      detail::assign_blocks(o, n, [&](int64_t j, int64_t w) { return v.segment(j, w).tanh(); });
    else
      detail::assign_blocks(o, n, [&](int64_t j, int64_t w) { return v.segment(j, w).logistic(); });
  });
  return true;
}

// Runs body<T>(out, inputs...) with T = float for f32/bf16 and double for f64; bf16 operands are
// converted to f32 first and the f32 result rounded into out once.
template <class Body>
void run_float(const Tensor& out, const std::vector<Tensor>& ins, Body&& body) {
  if (out.dtype() == DType::bf16) {
    std::vector<Tensor> fs;
    for (const Tensor& t : ins) fs.push_back(as_compute(t));
    Tensor of = empty(out.shape(), DType::f32);
    body.template operator()<float>(of, fs);
    out.copy_(of);
  } else if (out.dtype() == DType::f32) {
    body.template operator()<float>(out, ins);
  } else {
    body.template operator()<double>(out, ins);
  }
}

}  // namespace

void unary(const Tensor& out, const Tensor& x, Unary op, double p) {
  const char* name = unary_name(op);
  check_floating(out, name, "output");
  check_same_dtype(out, x, name);
  check_broadcasts_to(x, out, name, "input");
  charge_compute(name, unary_flops(op) * static_cast<double>(out.numel()),
                 static_cast<double>(out.nbytes() + x.nbytes()), out.dtype());
  if (meta_output(out, {&x}, name) || out.numel() == 0) return;
  run_float(out.detach(), {x.detach()},
            [&]<class T>(const Tensor& o, const std::vector<Tensor>& in) {
              if (eigen_unary<T>(o, in[0], op)) return;
              with_unary<T>(op, static_cast<T>(p), [&](auto f) { map1<T>(o, in[0], f); });
            });
}

void unary_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& y, Unary op,
                    double p) {
  const char* name = unary_name(op);
  UnarySaves saves = unary_backward_saves(op);
  const Tensor& s = saves == UnarySaves::output ? y : x;
  NXD_CHECK(saves == UnarySaves::none || s.defined(), "[", name, "_backward] needs the saved ",
            saves == UnarySaves::output ? "output" : "input");
  check_floating(dx, name, "gradient");
  check_same_dtype(dx, dy, name);
  check_broadcasts_to(dy, dx, name, "dy");
  if (saves != UnarySaves::none) {
    check_same_dtype(dx, s, name);
    check_broadcasts_to(s, dx, name, "saved tensor");
  }
  charge_compute(name, (unary_flops(op) + 1) * static_cast<double>(dx.numel()),
                 static_cast<double>(dx.nbytes() * 2 + (s.defined() ? s.nbytes() : 0)), dx.dtype());
  if (meta_output(dx, {&dy, &s}, name) || dx.numel() == 0) return;
  Tensor sv = saves == UnarySaves::none ? dy.detach() : s.detach();
  run_float(
      dx.detach(), {dy.detach(), sv}, [&]<class T>(const Tensor& o, const std::vector<Tensor>& in) {
        with_unary_grad<T>(op, static_cast<T>(p), [&](auto f) { map2<T>(o, in[0], in[1], f); });
      });
}

void binary(const Tensor& out, const Tensor& a, const Tensor& b, Binary op) {
  const char* name = binary_name(op);
  check_floating(out, name, "output");
  NXD_CHECK(a.dtype() == b.dtype() && a.dtype() == out.dtype(), "[", name,
            "] dtypes differ: a=", a.desc(), " b=", b.desc(), " out=", out.desc());
  check_broadcasts_to(a, out, name, "a");
  check_broadcasts_to(b, out, name, "b");
  charge_compute(name, static_cast<double>(out.numel()),
                 static_cast<double>(out.nbytes() + a.nbytes() + b.nbytes()), out.dtype());
  if (meta_output(out, {&a, &b}, name) || out.numel() == 0) return;
  run_float(out.detach(), {a.detach(), b.detach()},
            [&]<class T>(const Tensor& o, const std::vector<Tensor>& in) {
              with_binary<T>(op, [&](auto f) { map2<T>(o, in[0], in[1], f); });
            });
}

namespace ref {

namespace {
// Evaluates f on doubles over out's shape, reading broadcast inputs, and stores into out.
template <class F>
void eval(const Tensor& out, const std::vector<Tensor>& ins, F f) {
  std::vector<std::vector<double>> vals;
  for (const Tensor& t : ins) vals.push_back(t.detach().expand(out.shape()).to_vector());
  std::vector<double> r(static_cast<size_t>(out.numel()));
  for (size_t i = 0; i < r.size(); ++i) r[i] = f(vals, i);
  out.detach().copy_(from_doubles(r, out.shape(), DType::f64));
}
}  // namespace

void unary(const Tensor& out, const Tensor& x, Unary op, double p) {
  eval(out, {x}, [&](const std::vector<std::vector<double>>& v, size_t i) {
    return with_unary<double>(op, p, [&](auto f) { return f(v[0][i]); });
  });
}

void unary_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& y, Unary op,
                    double p) {
  Tensor s = unary_backward_saves(op) == UnarySaves::output  ? y
             : unary_backward_saves(op) == UnarySaves::input ? x
                                                             : dy;
  eval(dx, {dy, s}, [&](const std::vector<std::vector<double>>& v, size_t i) {
    return with_unary_grad<double>(op, p, [&](auto f) { return f(v[0][i], v[1][i]); });
  });
}

void binary(const Tensor& out, const Tensor& a, const Tensor& b, Binary op) {
  eval(out, {a, b}, [&](const std::vector<std::vector<double>>& v, size_t i) {
    return with_binary<double>(op, [&](auto f) { return f(v[0][i], v[1][i]); });
  });
}

}  // namespace ref

}  // namespace nxd::kernels

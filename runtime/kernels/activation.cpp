#include "nxd/runtime/kernels/activation.h"

#include <unsupported/Eigen/SpecialFunctions>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "nxd/runtime/kernels/nn_common.h"
#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::kernels {

using namespace detail;

namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1/sqrt(2 pi)
constexpr double kGeluC = 0.044715;
// Elementwise work is done in blocks that stay in L1 and vectorize. The blocks are fixed by the
// element count alone, and every block is computed into aligned scratch rows and copied to the
// outputs: Eigen computes the elements before its destination's first aligned packet with the
// scalar exp/tanh/erf, which round differently from the vectorized ones, so writing straight into
// an output would make its bits depend on its address (detail::assign_blocks). So the results
// depend neither on how the blocks are spread over threads nor on where the tensors lie.
constexpr int64_t kBlock = 2048;

// One block of an elementwise kernel: n elements of every operand, and an L1 scratch row.
template <class T, size_t NO, size_t NI>
struct Block {
  int64_t n;
  std::array<T*, NO> out;  // the block's aligned scratch row per output; null: not wanted
  std::array<const T*, NI> in;
  T* scratch;
  ArrMap<T> o(size_t k) const { return ArrMap<T>(out[k], n); }
  CArrMap<T> i(size_t k) const { return CArrMap<T>(in[k], n); }
  ArrMap<T> tmp() const { return ArrMap<T>(scratch, n); }
};

// The shared body of every activation kernel: outs (undefined = not wanted) and ins[1..] must
// match ins[0] in shape and dtype; charges `flops` per element; then runs body(Block<T>) over
// blocks of kBlock elements, in parallel for large tensors.
template <size_t NO, size_t NI, class Body>
void map_blocks(const char* op, double flops, const std::array<Tensor, NO>& outs,
                const std::array<std::pair<const char*, Tensor>, NI>& ins, Body&& body) {
  const Tensor& x = ins[0].second;
  const Tensor* any = nullptr;
  for (const Tensor& o : outs) {
    if (!o.defined()) continue;
    check_out(op, o, x.shape(), x.dtype());
    if (!any) any = &o;
  }
  for (size_t k = 1; k < NI; ++k) check_same(op, ins[k].first, ins[k].second, x);
  charge_compute(op, flops * x.numel(), double(NO + NI) * x.nbytes(), x.dtype());
  if (!any) return;
  for (const auto& [name, t] : ins)
    if (meta_only(op, *any, {t})) return;
  std::array<Tensor, NI> c;
  for (size_t k = 0; k < NI; ++k) c[k] = in(ins[k].second);
  dispatch_float(op, x, [&]<class T>() {
    std::array<T*, NO> o{};
    std::array<const T*, NI> ip{};
    for (size_t k = 0; k < NO; ++k) o[k] = outs[k].defined() ? outs[k].template data<T>() : nullptr;
    for (size_t k = 0; k < NI; ++k) ip[k] = c[k].template data<T>();
    for_rows(num_chunks(x.numel(), kBlock), kBlock * static_cast<int64_t>(flops),
             [&](int64_t b0, int64_t b1) {
               alignas(64) T scratch[kBlock];
               alignas(64) T rows[NO][kBlock];
               for (int64_t b = b0; b < b1; ++b) {
                 const int64_t s = b * kBlock, n = std::min(kBlock, x.numel() - s);
                 Block<T, NO, NI> blk{n, {}, {}, scratch};
                 for (size_t k = 0; k < NO; ++k) blk.out[k] = o[k] ? rows[k] : nullptr;
                 for (size_t k = 0; k < NI; ++k) blk.in[k] = ip[k] + s;
                 body(blk);
                 for (size_t k = 0; k < NO; ++k)
                   if (o[k]) std::copy(rows[k], rows[k] + n, o[k] + s);
               }
             });
  });
}

}  // namespace

void gelu_forward(const Tensor& y, const Tensor& x, bool tanh_approx) {
  map_blocks<1, 1>("gelu_forward", 10, {y}, {{{"x", x}}}, [&]<class T>(const Block<T, 1, 1>& b) {
    auto xv = b.i(0);
    if (tanh_approx)
      b.o(0) = T(0.5) * xv * (T(1) + (T(kSqrt2OverPi) * (xv + T(kGeluC) * xv.cube())).tanh());
    else
      b.o(0) = T(0.5) * xv * (T(1) + (xv * T(kInvSqrt2)).erf());
  });
}

void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, bool tanh_approx) {
  map_blocks<1, 2>(
      "gelu_backward", 16, {dx}, {{{"x", x}, {"dy", dy}}}, [&]<class T>(const Block<T, 1, 2>& b) {
        auto xv = b.i(0), g = b.i(1);
        auto tt = b.tmp();
        if (tanh_approx) {
          tt = (T(kSqrt2OverPi) * (xv + T(kGeluC) * xv.cube())).tanh();
          b.o(0) =
              g * (T(0.5) * (T(1) + tt) + T(0.5) * xv * (T(1) - tt.square()) * T(kSqrt2OverPi) *
                                              (T(1) + T(3 * kGeluC) * xv.square()));
        } else {
          tt = (xv * T(kInvSqrt2)).erf();
          b.o(0) = g * (T(0.5) * (T(1) + tt) + xv * (T(-0.5) * xv.square()).exp() * T(kInvSqrt2Pi));
        }
      });
}

void silu_forward(const Tensor& y, const Tensor& x) {
  map_blocks<1, 1>("silu_forward", 5, {y}, {{{"x", x}}}, [&]<class T>(const Block<T, 1, 1>& b) {
    auto xv = b.i(0);
    b.o(0) = xv / (T(1) + (-xv).exp());
  });
}

void silu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  map_blocks<1, 2>("silu_backward", 8, {dx}, {{{"x", x}, {"dy", dy}}},
                   [&]<class T>(const Block<T, 1, 2>& b) {
                     auto xv = b.i(0), sv = b.tmp();
                     sv = T(1) / (T(1) + (-xv).exp());
                     b.o(0) = b.i(1) * sv * (T(1) + xv * (T(1) - sv));
                   });
}

void swiglu_forward(const Tensor& y, const Tensor& gate, const Tensor& up) {
  map_blocks<1, 2>("swiglu_forward", 6, {y}, {{{"gate", gate}, {"up", up}}},
                   [&]<class T>(const Block<T, 1, 2>& b) {
                     auto gv = b.i(0);
                     b.o(0) = gv / (T(1) + (-gv).exp()) * b.i(1);
                   });
}

void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                     const Tensor& up) {
  map_blocks<2, 3>("swiglu_backward", 10, {dgate, dup}, {{{"gate", gate}, {"up", up}, {"dy", dy}}},
                   [&]<class T>(const Block<T, 2, 3>& b) {
                     auto gv = b.i(0), uv = b.i(1), g = b.i(2), sv = b.tmp();
                     sv = T(1) / (T(1) + (-gv).exp());
                     if (b.out[1]) b.o(1) = g * gv * sv;
                     if (b.out[0]) b.o(0) = g * uv * sv * (T(1) + gv * (T(1) - sv));
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

// Reductions: sum, mean, amax, sum_to. Backward broadcasts the gradient back over the reduced
// dims (amax: to the position of the first maximum).
#include "nxd/runtime/kernels/reduce.h"
#include "nxd/autograd/ops/basic.h"
#include "nxd/runtime/kernels/elementwise.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

namespace {

void check_input(const Tensor& x, const char* op) {
  NXD_CHECK(x.defined(), "[", op, "] undefined input");
  NXD_CHECK(is_floating(x.dtype()), "[", op, "] needs a floating tensor, got ", x.desc());
}

// dx[xs] = scale * g broadcast over the reduced dims (g has the keepdim shape `keep` or the
// reduced shape), materialized contiguous.
Tensor expand_grad(const Tensor& g, const Shape& keep, const Shape& xs, double scale) {
  Tensor gk = g.reshape(keep).expand(xs);
  Tensor dx = empty(xs, g.dtype(), g.device());
  kernels::unary(dx, gk, kernels::Unary::mul_scalar, scale);
  return dx;
}

Tensor sum_impl(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, bool mean) {
  const char* op = mean ? "mean" : "sum";
  check_input(x, op);
  Tensor y = empty(kernels::reduced_shape(x.shape(), dims, keepdim, op), x.dtype(), x.device());
  if (mean)
    kernels::mean(y, x.detach(), dims, keepdim);
  else
    kernels::sum(y, x.detach(), dims, keepdim);
  if (!autograd::needs_grad({x})) return y;
  const Shape xs = x.shape(), keep = kernels::reduced_shape(xs, dims, /*keepdim=*/true, op);
  const double n = static_cast<double>(shape_numel(xs)) /
                   static_cast<double>(std::max<int64_t>(shape_numel(keep), 1));
  const double scale = mean ? 1.0 / n : 1.0;
  autograd::record(op, {x}, {y}, [xs, keep, scale](const Grads& g) -> Grads {
    return {expand_grad(g[0], keep, xs, scale)};
  });
  return y;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  OpScope scope_("sum");
  return scope_.out(
      [&]() -> Tensor { return sum_impl(x, dims, keepdim, /*mean=*/false); }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("dims", dims).set("keepdim", int64_t(keepdim))};
      });
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  OpScope scope_("mean");
  return scope_.out(
      [&]() -> Tensor { return sum_impl(x, dims, keepdim, /*mean=*/true); }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("dims", dims).set("keepdim", int64_t(keepdim))};
      });
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  OpScope scope_("sum_to");
  return scope_.out(
      [&]() -> Tensor {
        check_input(x, "sum_to");
        Tensor y = empty(shape, x.dtype(), x.device());
        kernels::sum_to(y, x.detach());
        if (!autograd::needs_grad({x})) return y;
        const Shape xs = x.shape();
        autograd::record("sum_to", {x}, {y}, [xs](const Grads& g) -> Grads {
          Tensor dx = empty(xs, g[0].dtype(), g[0].device());
          dx.copy_(g[0]);
          return {dx};
        });
        return y;
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("shape", shape)};
      });
}

Tensor amax(const Tensor& x, int64_t dim, bool keepdim) {
  OpScope scope_("amax");
  return scope_.out(
      [&]() -> Tensor {
        check_input(x, "amax");
        const int64_t d = wrap_dim(dim, x.dim(), "amax");
        const Shape s = kernels::reduced_shape(x.shape(), {d}, keepdim, "amax");
        Tensor y = empty(s, x.dtype(), x.device());
        const bool grad = autograd::needs_grad({x});
        Tensor idx = grad ? empty(s, DType::i64, x.device()) : Tensor();
        kernels::amax(y, idx, x.detach(), d, keepdim);
        if (!grad) return y;
        const Shape xs = x.shape();
        autograd::record("amax", {x}, {y}, [xs, d, idx](const Grads& g) -> Grads {
          Tensor dx = zeros(xs, g[0].dtype(), g[0].device());
          if (dx.is_meta()) return {dx};
          int64_t outer = 1, inner = 1;
          const int64_t len = xs[d];
          for (int64_t i = 0; i < d; ++i) outer *= xs[i];
          for (size_t i = d + 1; i < xs.size(); ++i) inner *= xs[i];
          Tensor gc = g[0].contiguous();
          Tensor ic = idx.contiguous();
          const int64_t* ip = ic.data<int64_t>();
          dispatch(dx.dtype(), [&]<class T>() {
            T* dp = dx.data<T>();
            const T* gp = gc.data<T>();
            for (int64_t o = 0; o < outer; ++o)
              for (int64_t i = 0; i < inner; ++i)
                dp[(o * len + ip[o * inner + i]) * inner + i] = gp[o * inner + i];
          });
          return {dx};
        });
        return y;
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("dim", dim).set("keepdim", int64_t(keepdim))};
      });
}

}  // namespace nxd

// Differentiable shape ops: views and copies of the Tensor raw methods. Backward maps the
// gradient back onto the input's shape: views invert their index map, narrow/slice/select
// scatter into zeros, expand sums, cat/stack/chunk/split slice or concatenate.
#include <numeric>

#include "nxd/autograd/ops/basic.h"
#include "nxd/runtime/kernels/reduce.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

namespace {

Tensor checked(const Tensor& x, const char* op) {
  NXD_CHECK(x.defined(), "[", op, "] undefined input");
  return x.detach();
}

// y = view_fn(x) recorded with a backward that reshapes the gradient to x's shape.
template <class F>
Tensor reshaping(const Tensor& x, const char* op, F view_fn) {
  Tensor y = view_fn(checked(x, op));
  const Shape xs = x.shape();
  autograd::record(op, {x}, {y}, [xs](const Grads& g) -> Grads { return {g[0].reshape(xs)}; });
  return y;
}

// y = view_fn(x) for a view that selects part of x: backward writes g into that part of zeros.
template <class F>
Tensor selecting(const Tensor& x, const char* op, F view_fn) {
  Tensor y = view_fn(checked(x, op));
  const Shape xs = x.shape();
  autograd::record(op, {x}, {y}, [xs, view_fn](const Grads& g) -> Grads {
    Tensor dx = zeros(xs, g[0].dtype(), g[0].device());
    view_fn(dx).copy_(g[0]);
    return {dx};
  });
  return y;
}

}  // namespace

Tensor view(const Tensor& x, const Shape& shape) {
  OpScope scope_("view");
  return scope_.out(
      [&]() -> Tensor {
        return reshaping(x, "view", [&](const Tensor& t) { return t.view(shape); });
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("shape", shape)};
      });
}
Tensor reshape(const Tensor& x, const Shape& shape) {
  OpScope scope_("reshape");
  return scope_.out(
      [&]() -> Tensor {
        return reshaping(x, "reshape", [&](const Tensor& t) { return t.reshape(shape); });
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("shape", shape)};
      });
}
Tensor squeeze(const Tensor& x, int64_t dim) {
  OpScope scope_("squeeze");
  return scope_.out(
      [&]() -> Tensor {
        return reshaping(x, "squeeze", [&](const Tensor& t) { return t.squeeze(dim); });
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("dim", dim)};
      });
}
Tensor unsqueeze(const Tensor& x, int64_t dim) {
  OpScope scope_("unsqueeze");
  return scope_.out(
      [&]() -> Tensor {
        return reshaping(x, "unsqueeze", [&](const Tensor& t) { return t.unsqueeze(dim); });
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("dim", dim)};
      });
}
Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  OpScope scope_("flatten");
  return scope_.out(
      [&]() -> Tensor {
        return reshaping(x, "flatten",
                         [&](const Tensor& t) { return t.flatten(start_dim, end_dim); });
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("start_dim", start_dim).set("end_dim", end_dim)};
      });
}

Tensor transpose(const Tensor& x, int64_t a, int64_t b) {
  OpScope scope_("transpose");
  return scope_.out(
      [&]() -> Tensor {
        Tensor y = checked(x, "transpose").transpose(a, b);
        autograd::record("transpose", {x}, {y},
                         [a, b](const Grads& g) -> Grads { return {g[0].transpose(a, b)}; });
        return y;
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("a", a).set("b", b)};
      });
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  OpScope scope_("permute");
  return scope_.out(
      [&]() -> Tensor {
        Tensor y = checked(x, "permute").permute(dims);
        std::vector<int64_t> inv(dims.size());
        for (size_t i = 0; i < dims.size(); ++i)
          inv[static_cast<size_t>(wrap_dim(dims[i], x.dim(), "permute"))] = static_cast<int64_t>(i);
        autograd::record("permute", {x}, {y},
                         [inv](const Grads& g) -> Grads { return {g[0].permute(inv)}; });
        return y;
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("dims", dims)};
      });
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  OpScope scope_("narrow");
  return scope_.out(
      [&]() -> Tensor {
        return selecting(x, "narrow", [dim, start, length](const Tensor& t) {
          return t.narrow(dim, start, length);
        });
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("dim", dim).set("start", start).set("length", length)};
      });
}
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  OpScope scope_("slice");
  return scope_.out(
      [&]() -> Tensor {
        return selecting(x, "slice", [dim, start, end, step](const Tensor& t) {
          return t.slice(dim, start, end, step);
        });
      }(),
      [&] {
        return OpCall{
            {x}, OpAttrs().set("dim", dim).set("start", start).set("end", end).set("step", step)};
      });
}
Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  OpScope scope_("select");
  return scope_.out(
      [&]() -> Tensor {
        return selecting(x, "select",
                         [dim, index](const Tensor& t) { return t.select(dim, index); });
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("dim", dim).set("index", index)};
      });
}

Tensor expand(const Tensor& x, const Shape& shape) {
  OpScope scope_("expand");
  return scope_.out(
      [&]() -> Tensor {
        Tensor y = checked(x, "expand").expand(shape);
        const Shape xs = x.shape();
        autograd::record("expand", {x}, {y}, [xs](const Grads& g) -> Grads {
          if (g[0].shape() == xs) return {g[0]};
          Tensor dx = empty(xs, g[0].dtype(), g[0].device());
          kernels::sum_to(dx, g[0]);
          return {dx};
        });
        return y;
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("shape", shape)};
      });
}

Tensor contiguous(const Tensor& x) {
  OpScope scope_("contiguous");
  return scope_.out(
      [&]() -> Tensor {
        Tensor y = checked(x, "contiguous").contiguous();
        autograd::record("contiguous", {x}, {y}, [](const Grads& g) -> Grads { return {g[0]}; });
        return y;
      }(),
      [&] {
        return OpCall{{x}, OpAttrs()};
      });
}

Tensor clone(const Tensor& x) {
  OpScope scope_("clone");
  return scope_.out(
      [&]() -> Tensor {
        Tensor y = checked(x, "clone").clone();
        autograd::record("clone", {x}, {y}, [](const Grads& g) -> Grads { return {g[0]}; });
        return y;
      }(),
      [&] {
        return OpCall{{x}, OpAttrs()};
      });
}

Tensor to(const Tensor& x, DType dtype) {
  OpScope scope_("to");
  return scope_.out(
      [&]() -> Tensor {
        Tensor y = checked(x, "to").to(dtype);
        const DType xt = x.dtype();
        autograd::record("to", {x}, {y}, [xt](const Grads& g) -> Grads { return {g[0].to(xt)}; });
        return y;
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("dtype", int64_t(dtype))};
      });
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  OpScope scope_("cat");
  return scope_.out(
      [&]() -> Tensor {
        NXD_CHECK(!xs.empty(), "[cat] needs at least one tensor");
        std::vector<Tensor> ds;
        for (const Tensor& x : xs) ds.push_back(checked(x, "cat"));
        Tensor y = cat_raw(ds, dim);
        const int64_t d = wrap_dim(dim, xs[0].dim(), "cat");
        std::vector<int64_t> sizes;
        for (const Tensor& x : xs) sizes.push_back(x.shape()[d]);
        autograd::record("cat", xs, {y}, [d, sizes](const Grads& g) -> Grads {
          Grads r;
          int64_t pos = 0;
          for (int64_t s : sizes) {
            r.push_back(g[0].narrow(d, pos, s));
            pos += s;
          }
          return r;
        });
        return y;
      }(),
      [&] {
        return OpCall{xs, OpAttrs().set("dim", dim)};
      });
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  OpScope scope_("stack");
  return scope_.out(
      [&]() -> Tensor {
        NXD_CHECK(!xs.empty(), "[stack] needs at least one tensor");
        std::vector<Tensor> ds;
        for (const Tensor& x : xs) ds.push_back(checked(x, "stack"));
        Tensor y = stack_raw(ds, dim);
        const int64_t d = wrap_dim(dim, xs[0].dim() + 1, "stack");
        const size_t n = xs.size();
        autograd::record("stack", xs, {y}, [d, n](const Grads& g) -> Grads {
          Grads r;
          for (size_t i = 0; i < n; ++i) r.push_back(g[0].select(d, static_cast<int64_t>(i)));
          return r;
        });
        return y;
      }(),
      [&] {
        return OpCall{xs, OpAttrs().set("dim", dim)};
      });
}

namespace {
// Pieces of x along dim; backward concatenates the pieces' gradients (zeros for unused ones).
std::vector<Tensor> pieces(const Tensor& x, std::vector<Tensor> ys, int64_t dim, const char* op) {
  const int64_t d = wrap_dim(dim, x.dim(), op);
  autograd::record(op, {x}, ys, [d](const Grads& g) -> Grads { return {cat_raw(g, d)}; });
  return ys;
}
}  // namespace

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  OpScope scope_("chunk");
  return scope_.outs(
      [&]() -> std::vector<Tensor> {
        return pieces(x, checked(x, "chunk").chunk(chunks, dim), dim, "chunk");
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("chunks", chunks).set("dim", dim)};
      });
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  OpScope scope_("split");
  return scope_.outs(
      [&]() -> std::vector<Tensor> {
        return pieces(x, checked(x, "split").split(sizes, dim), dim, "split");
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("sizes", sizes).set("dim", dim)};
      });
}

}  // namespace nxd

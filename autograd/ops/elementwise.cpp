// Elementwise ops with NumPy broadcasting: forward kernels in runtime/kernels/elementwise.h;
// the backward of a broadcasting op sums each input's gradient down to the input's shape.
#include "nxd/runtime/kernels/elementwise.h"
#include "nxd/autograd/ops/basic.h"
#include "nxd/runtime/kernels/reduce.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

using kernels::Binary;
using kernels::Unary;

namespace {

Device device_of(const Tensor& a, const Tensor& b) {
  return a.is_meta() || b.is_meta() ? Device::meta : Device::host;
}

void check_inputs(const Tensor& a, const Tensor& b, const char* op) {
  NXD_CHECK(a.defined() && b.defined(), "[", op, "] undefined input");
  NXD_CHECK(is_floating(a.dtype()) && a.dtype() == b.dtype(), "[", op,
            "] needs two floating tensors of one dtype, got ", a.desc(), " and ", b.desc());
}

// g summed down to `shape` (g itself when the shapes already agree).
Tensor reduce_to(const Tensor& g, const Shape& shape, double scale = 1.0) {
  if (g.shape() == shape && scale == 1.0) return g;
  Tensor r = empty(shape, g.dtype(), g.device());
  kernels::sum_to(r, g, scale);
  return r;
}

Tensor binary_product(const Tensor& x, const Tensor& y, Binary op) {
  Tensor r = empty(broadcast_shapes(x.shape(), y.shape(), kernels::binary_name(op)), x.dtype(),
                   device_of(x, y));
  kernels::binary(r, x, y, op);
  return r;
}

Tensor binary_op(const Tensor& a, const Tensor& b, Binary op) {
  const char* name = kernels::binary_name(op);
  check_inputs(a, b, name);
  Tensor ad = a.detach(), bd = b.detach();
  Tensor y = empty(broadcast_shapes(a.shape(), b.shape(), name), a.dtype(), device_of(a, b));
  kernels::binary(y, ad, bd, op);
  if (!autograd::needs_grad({a, b})) return y;
  const bool na = a.requires_grad(), nb = b.requires_grad();
  const Shape as = a.shape(), bs = b.shape();
  autograd::BackwardFn fn;
  switch (op) {
    case Binary::add:
    case Binary::sub:
      fn = [as, bs, op](const Grads& g) -> Grads {
        return {reduce_to(g[0], as), reduce_to(g[0], bs, op == Binary::sub ? -1.0 : 1.0)};
      };
      break;
    case Binary::mul: {
      Tensor keep_a = nb ? ad : Tensor(), keep_b = na ? bd : Tensor();
      fn = [as, bs, na, nb, keep_a, keep_b](const Grads& g) -> Grads {
        Grads r(2);
        if (na) r[0] = reduce_to(binary_product(g[0], keep_b, Binary::mul), as);
        if (nb) r[1] = reduce_to(binary_product(g[0], keep_a, Binary::mul), bs);
        return r;
      };
      break;
    }
    case Binary::div: {
      Tensor yd = y.detach();
      fn = [as, bs, na, nb, bd, yd = nb ? yd : Tensor()](const Grads& g) -> Grads {
        Grads r(2);
        if (na) r[0] = reduce_to(binary_product(g[0], bd, Binary::div), as);
        if (nb)  // d(a/b)/db = -y/b
          r[1] = reduce_to(binary_product(binary_product(g[0], yd, Binary::mul), bd, Binary::div),
                           bs, -1.0);
        return r;
      };
      break;
    }
    default:
      throw InternalError(str("[", name, "] no backward"));
  }
  autograd::record(name, {a, b}, {y}, std::move(fn));
  return y;
}

Tensor unary_op(const Tensor& x, Unary op, double p = 0.0) {
  const char* name = kernels::unary_name(op);
  NXD_CHECK(x.defined(), "[", name, "] undefined input");
  NXD_CHECK(is_floating(x.dtype()), "[", name, "] needs a floating tensor, got ", x.desc());
  Tensor xd = x.detach();
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  kernels::unary(y, xd, op, p);
  if (!autograd::needs_grad({x})) return y;
  const kernels::UnarySaves saves = kernels::unary_backward_saves(op);
  Tensor sx = saves == kernels::UnarySaves::input ? xd : Tensor();
  Tensor sy = saves == kernels::UnarySaves::output ? y.detach() : Tensor();
  autograd::record(name, {x}, {y}, [sx, sy, op, p](const Grads& g) -> Grads {
    Tensor dx = empty(g[0].shape(), g[0].dtype(), g[0].device());
    kernels::unary_backward(dx, g[0], sx, sy, op, p);
    return {dx};
  });
  return y;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  OpScope scope_("add");
  return scope_.out([&]() -> Tensor { return binary_op(a, b, Binary::add); }(),
                    [&] {
                      return OpCall{{a, b}, OpAttrs()};
                    });
}
Tensor sub(const Tensor& a, const Tensor& b) {
  OpScope scope_("sub");
  return scope_.out([&]() -> Tensor { return binary_op(a, b, Binary::sub); }(),
                    [&] {
                      return OpCall{{a, b}, OpAttrs()};
                    });
}
Tensor mul(const Tensor& a, const Tensor& b) {
  OpScope scope_("mul");
  return scope_.out([&]() -> Tensor { return binary_op(a, b, Binary::mul); }(),
                    [&] {
                      return OpCall{{a, b}, OpAttrs()};
                    });
}
Tensor div(const Tensor& a, const Tensor& b) {
  OpScope scope_("div");
  return scope_.out([&]() -> Tensor { return binary_op(a, b, Binary::div); }(),
                    [&] {
                      return OpCall{{a, b}, OpAttrs()};
                    });
}
Tensor add(const Tensor& a, double s) {
  OpScope scope_("add_scalar");
  return scope_.out([&]() -> Tensor { return unary_op(a, Unary::add_scalar, s); }(),
                    [&] {
                      return OpCall{{a}, OpAttrs().set("s", s)};
                    });
}
Tensor mul(const Tensor& a, double s) {
  OpScope scope_("mul_scalar");
  return scope_.out([&]() -> Tensor { return unary_op(a, Unary::mul_scalar, s); }(),
                    [&] {
                      return OpCall{{a}, OpAttrs().set("s", s)};
                    });
}
Tensor neg(const Tensor& a) {
  OpScope scope_("neg");
  return scope_.out([&]() -> Tensor { return unary_op(a, Unary::neg); }(),
                    [&] {
                      return OpCall{{a}, OpAttrs()};
                    });
}
Tensor exp(const Tensor& a) {
  OpScope scope_("exp");
  return scope_.out([&]() -> Tensor { return unary_op(a, Unary::exp); }(),
                    [&] {
                      return OpCall{{a}, OpAttrs()};
                    });
}
Tensor log(const Tensor& a) {
  OpScope scope_("log");
  return scope_.out([&]() -> Tensor { return unary_op(a, Unary::log); }(),
                    [&] {
                      return OpCall{{a}, OpAttrs()};
                    });
}
Tensor sqrt(const Tensor& a) {
  OpScope scope_("sqrt");
  return scope_.out([&]() -> Tensor { return unary_op(a, Unary::sqrt); }(),
                    [&] {
                      return OpCall{{a}, OpAttrs()};
                    });
}
Tensor rsqrt(const Tensor& a) {
  OpScope scope_("rsqrt");
  return scope_.out([&]() -> Tensor { return unary_op(a, Unary::rsqrt); }(),
                    [&] {
                      return OpCall{{a}, OpAttrs()};
                    });
}
Tensor tanh(const Tensor& a) {
  OpScope scope_("tanh");
  return scope_.out([&]() -> Tensor { return unary_op(a, Unary::tanh); }(),
                    [&] {
                      return OpCall{{a}, OpAttrs()};
                    });
}
Tensor sigmoid(const Tensor& a) {
  OpScope scope_("sigmoid");
  return scope_.out([&]() -> Tensor { return unary_op(a, Unary::sigmoid); }(),
                    [&] {
                      return OpCall{{a}, OpAttrs()};
                    });
}
Tensor relu(const Tensor& a) {
  OpScope scope_("relu");
  return scope_.out([&]() -> Tensor { return unary_op(a, Unary::relu); }(),
                    [&] {
                      return OpCall{{a}, OpAttrs()};
                    });
}
Tensor square(const Tensor& a) {
  OpScope scope_("square");
  return scope_.out([&]() -> Tensor { return unary_op(a, Unary::square); }(),
                    [&] {
                      return OpCall{{a}, OpAttrs()};
                    });
}
Tensor abs(const Tensor& a) {
  OpScope scope_("abs");
  return scope_.out([&]() -> Tensor { return unary_op(a, Unary::abs); }(),
                    [&] {
                      return OpCall{{a}, OpAttrs()};
                    });
}
Tensor pow(const Tensor& a, double exponent) {
  OpScope scope_("pow");
  return scope_.out([&]() -> Tensor { return unary_op(a, Unary::pow, exponent); }(),
                    [&] {
                      return OpCall{{a}, OpAttrs().set("exponent", exponent)};
                    });
}

}  // namespace nxd

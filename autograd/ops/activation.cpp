// gelu (erf and tanh forms), silu and the fused swiglu = silu(gate) * up.
#include "nxd/runtime/kernels/activation.h"
#include "nxd/autograd/ops/nn.h"
#include "nxd/autograd/ops/nn_internal.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

using namespace nn_detail;

Tensor gelu(const Tensor& x, GeluApprox approx) {
  OpScope scope_("gelu");
  return scope_.out(
      [&]() -> Tensor {
        check_float("gelu", "input", x);
        const DType dt = x.dtype();
        const bool th = approx == GeluApprox::tanh;
        Tensor xc = compute(x), yc = empty_like(xc);
        kernels::gelu_forward(yc, xc, th);
        Tensor y = to_dtype(yc, dt);
        autograd::record("gelu", {x}, {y}, [xk = keep(x, xc), th, dt](const Grads& g) -> Grads {
          const Tensor xc = compute(xk);
          Tensor dx = empty_like(xc);
          kernels::gelu_backward(dx, compute(g[0]), xc, th);
          return {to_dtype(dx, dt)};
        });
        return y;
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("approx", int64_t(approx))};
      });
}

Tensor silu(const Tensor& x) {
  OpScope scope_("silu");
  return scope_.out(
      [&]() -> Tensor {
        check_float("silu", "input", x);
        const DType dt = x.dtype();
        Tensor xc = compute(x), yc = empty_like(xc);
        kernels::silu_forward(yc, xc);
        Tensor y = to_dtype(yc, dt);
        autograd::record("silu", {x}, {y}, [xk = keep(x, xc), dt](const Grads& g) -> Grads {
          const Tensor xc = compute(xk);
          Tensor dx = empty_like(xc);
          kernels::silu_backward(dx, compute(g[0]), xc);
          return {to_dtype(dx, dt)};
        });
        return y;
      }(),
      [&] {
        return OpCall{{x}, OpAttrs()};
      });
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  OpScope scope_("swiglu");
  return scope_.out(
      [&]() -> Tensor {
        check_float("swiglu", "gate", gate);
        check_float("swiglu", "up", up);
        NXD_CHECK_SHAPE(gate.shape() == up.shape() && gate.dtype() == up.dtype(),
                        "[swiglu] gate and up differ: gate=", gate.desc(), " up=", up.desc());
        const DType dt = gate.dtype();
        Tensor gc = compute(gate), uc = compute(up);
        Tensor yc = empty(gate.shape(), gc.dtype(), device_of({gate, up}));
        kernels::swiglu_forward(yc, gc, uc);
        Tensor y = to_dtype(yc, dt);
        const bool ng = gate.requires_grad(), nu = up.requires_grad();
        autograd::record(
            "swiglu", {gate, up}, {y},
            [gk = keep(gate, gc), uk = keep(up, uc), ng, nu, dt](const Grads& g) -> Grads {
              const Tensor gc = compute(gk), uc = compute(uk);
              Tensor dg = ng ? empty(gc.shape(), gc.dtype(), gc.device()) : Tensor();
              Tensor du = nu ? empty(gc.shape(), gc.dtype(), gc.device()) : Tensor();
              kernels::swiglu_backward(dg, du, compute(g[0]), gc, uc);
              return {to_dtype(dg, dt), to_dtype(du, dt)};
            });
        return y;
      }(),
      [&] {
        return OpCall{{gate, up}, OpAttrs()};
      });
}

}  // namespace nxd

// softmax and log_softmax over any dim (the kernel works over the last dim: other dims are
// transposed there and back as views).
#include "nxd/runtime/kernels/softmax.h"
#include "nxd/autograd/ops/nn.h"
#include "nxd/autograd/ops/nn_internal.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

using namespace nn_detail;

namespace {

Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_float(op, "input", x);
  const DType dt = x.dtype();
  if (x.dim() == 0) {  // softmax of a scalar is 1, log_softmax 0
    Tensor y = full({}, log ? 0.0 : 1.0, dt, x.device());
    autograd::record(op, {x}, {y}, [](const Grads& g) -> Grads { return {zeros_like(g[0])}; });
    return y;
  }
  const int64_t d = wrap_dim(dim, x.dim(), op);
  const int64_t last = x.dim() - 1;
  Tensor xt = compute(x);
  if (d != last) xt = xt.transpose(d, last);
  Tensor yc = empty(xt.shape(), compute_dtype(dt), x.device());
  if (log)
    kernels::log_softmax_forward(yc, xt);
  else
    kernels::softmax_forward(yc, xt);
  Tensor y = to_dtype(d != last ? yc.transpose(d, last) : yc, dt);
  // yc may be y itself: capture a detached handle (no reference cycle); a bf16 softmax keeps its
  // bf16 output (its f32 value rounded: backward uses that, as PyTorch's bf16 softmax does)
  Tensor yk = dt == DType::bf16 ? y.detach() : yc.detach();
  if (dt == DType::bf16 && d != last) yk = yk.transpose(d, last);
  autograd::record(op, {x}, {y}, [yk, d, last, log, dt](const Grads& g) -> Grads {
    const Tensor yc = compute(yk);
    Tensor gt = compute(g[0]);
    if (d != last) gt = gt.transpose(d, last);
    Tensor dx = empty_like(yc);
    if (log)
      kernels::log_softmax_backward(dx, gt, yc);
    else
      kernels::softmax_backward(dx, gt, yc);
    return {to_dtype(d != last ? dx.transpose(d, last) : dx, dt)};
  });
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  OpScope scope_("softmax");
  return scope_.out([&]() -> Tensor { return softmax_impl(x, dim, /*log=*/false); }(),
                    [&] {
                      return OpCall{{x}, OpAttrs().set("dim", dim)};
                    });
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  OpScope scope_("log_softmax");
  return scope_.out([&]() -> Tensor { return softmax_impl(x, dim, /*log=*/true); }(),
                    [&] {
                      return OpCall{{x}, OpAttrs().set("dim", dim)};
                    });
}

}  // namespace nxd

// dropout: the mask is regenerated from the stream in backward (nothing stored but the stream).
#include "nxd/runtime/kernels/dropout.h"
#include "nxd/autograd/ops/nn.h"
#include "nxd/autograd/ops/nn_internal.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

using namespace nn_detail;

Tensor dropout(const Tensor& x, double p, bool training, const RngStream* stream) {
  OpScope scope_("dropout");
  return scope_.out(
      [&]() -> Tensor {
        check_float("dropout", "input", x);
        NXD_CHECK(p >= 0.0 && p <= 1.0, "[dropout] p must be in [0, 1], got ", p);
        if (!training || p == 0.0) return x;
        const RngStream st = stream ? *stream : current_context().rng().next();
        const DType dt = x.dtype();
        Tensor xc = compute(x), yc = empty(x.shape(), xc.dtype(), x.device());
        kernels::dropout_apply(yc, xc, p, st);
        Tensor y = to_dtype(yc, dt);
        autograd::record("dropout", {x}, {y}, [p, st, dt](const Grads& g) -> Grads {
          Tensor gc = compute(g[0]), dx = empty(gc.shape(), gc.dtype(), gc.device());
          kernels::dropout_apply(dx, gc, p, st);
          return {to_dtype(dx, dt)};
        });
        return y;
      }(),
      [&] {
        return OpCall{{x}, OpAttrs().set("p", p).set("training", int64_t(training))};
      });
}

}  // namespace nxd

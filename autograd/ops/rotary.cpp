// rotary: HF rotate-half rotary embeddings; the backward rotates the gradient by -theta.
#include "nxd/runtime/kernels/rotary.h"
#include "nxd/autograd/ops/nn.h"
#include "nxd/autograd/ops/nn_internal.h"

namespace nxd {

using namespace nn_detail;

Tensor rotary(const Tensor& x, const RotaryOptions& opts) {
  check_float("rotary", "input", x);
  const DType dt = x.dtype();
  Tensor xc = compute(x), yc = empty(x.shape(), xc.dtype(), x.device());
  kernels::rotary_forward(yc, xc, opts.rotary_dim, opts.base, opts.position_offset);
  Tensor y = to_dtype(yc, dt);
  autograd::record("rotary", {x}, {y}, [opts, dt](const Grads& g) -> Grads {
    Tensor gc = compute(g[0]), dx = empty(gc.shape(), gc.dtype(), gc.device());
    kernels::rotary_forward(dx, gc, opts.rotary_dim, opts.base, opts.position_offset, true);
    return {to_dtype(dx, dt)};
  });
  return y;
}

}  // namespace nxd

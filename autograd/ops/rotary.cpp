// rotary: HF rotate-half rotary embeddings; the backward rotates the gradient by -theta.
#include "nxd/runtime/kernels/rotary.h"
#include "nxd/autograd/ops/nn.h"
#include "nxd/autograd/ops/nn_internal.h"

namespace nxd {

using namespace nn_detail;

namespace {
// An uninitialized [B, H, S, D] tensor in [B, S, H, D] memory when x is such a view (the usual
// q/k projections), so the layout flows through to attention; else contiguous.
Tensor empty_like_layout(const Tensor& x, DType dt) {
  if (x.dim() == 4 && !x.is_contiguous() && x.transpose(1, 2).is_contiguous())
    return empty({x.size(0), x.size(2), x.size(1), x.size(3)}, dt, x.device()).transpose(1, 2);
  return empty(x.shape(), dt, x.device());
}
}  // namespace

Tensor rotary(const Tensor& x, const RotaryOptions& opts) {
  check_float("rotary", "input", x);
  const DType dt = x.dtype();
  Tensor xc = compute(x), yc = empty_like_layout(xc, xc.dtype());
  kernels::rotary_forward(yc, xc, opts.rotary_dim, opts.base, opts.position_offset, false,
                          opts.scaling);
  Tensor y = to_dtype(yc, dt);
  autograd::record("rotary", {x}, {y}, [opts, dt](const Grads& g) -> Grads {
    Tensor gc = compute(g[0]), dx = empty_like_layout(gc, gc.dtype());
    kernels::rotary_forward(dx, gc, opts.rotary_dim, opts.base, opts.position_offset, true,
                            opts.scaling);
    return {to_dtype(dx, dt)};
  });
  return y;
}

}  // namespace nxd

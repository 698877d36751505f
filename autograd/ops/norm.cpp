// layer_norm and rms_norm over the last dim; forward saves the row statistics, backward is one
// fused kernel (dx, dweight, dbias).
#include "nxd/runtime/kernels/norm.h"
#include "nxd/autograd/ops/nn.h"
#include "nxd/autograd/ops/nn_internal.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

using namespace nn_detail;

namespace {

Shape rows_shape(const Tensor& x) {
  Shape s = x.shape();
  s.pop_back();
  return s;
}

void check_param(const char* op, const char* what, const Tensor& p, const Tensor& x) {
  if (!p.defined()) return;
  NXD_CHECK_SHAPE(p.dim() == 1 && p.size(0) == x.size(-1), "[", op, "] ", what, " is ", p.desc(),
                  ", expected [", x.size(-1), "] for input ", x.desc());
  NXD_CHECK(p.dtype() == x.dtype(), "[", op, "] ", what, " is ", p.desc(), " but input is ",
            x.desc());
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  OpScope scope_("layer_norm");
  return scope_.out(
      [&]() -> Tensor {
        const char* op = "layer_norm";
        check_float(op, "input", x);
        NXD_CHECK_SHAPE(x.dim() >= 1, "[", op, "] input must have at least 1 dim, got ", x.desc());
        check_param(op, "weight", weight, x);
        check_param(op, "bias", bias, x);
        const DType dt = x.dtype(), ct = compute_dtype(dt);
        const Device dev = device_of({x, weight, bias});
        Tensor xc = compute(x), wc = compute(weight), bc = compute(bias);
        Tensor yc = empty(x.shape(), ct, dev), mean = empty(rows_shape(x), ct, dev),
               rstd = empty(rows_shape(x), ct, dev);
        kernels::layer_norm_forward(yc, mean, rstd, xc, wc, bc, eps);
        Tensor y = to_dtype(yc, dt);
        const bool need_w = weight.defined() && weight.requires_grad(),
                   need_b = bias.defined() && bias.requires_grad();
        autograd::record(
            op, {x, weight, bias}, {y},
            [xk = keep(x, xc), wc, mean, rstd, need_w, need_b, dt, ct](const Grads& g) -> Grads {
              const Tensor& gd = g[0];
              const Tensor xc = compute(xk);
              Tensor gc = compute(gd), dx = empty_like(xc);
              Shape ps{xc.size(-1)};
              Tensor dw = need_w ? empty(ps, ct, xc.device()) : Tensor();
              Tensor db = need_b ? empty(ps, ct, xc.device()) : Tensor();
              kernels::layer_norm_backward(dx, dw, db, gc, xc, mean, rstd, wc);
              return {to_dtype(dx, dt), to_dtype(dw, dt), to_dtype(db, dt)};
            });
        return y;
      }(),
      [&] {
        return OpCall{{x, weight, bias}, OpAttrs().set("eps", eps)};
      });
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  OpScope scope_("rms_norm");
  return scope_.out(
      [&]() -> Tensor {
        const char* op = "rms_norm";
        check_float(op, "input", x);
        NXD_CHECK_SHAPE(x.dim() >= 1, "[", op, "] input must have at least 1 dim, got ", x.desc());
        check_param(op, "weight", weight, x);
        const DType dt = x.dtype(), ct = compute_dtype(dt);
        const Device dev = device_of({x, weight});
        Tensor xc = compute(x), wc = compute(weight);
        Tensor rstd = empty(rows_shape(x), ct, dev), y;
        if (dt == DType::bf16 && weight.defined()) {
          // HF LlamaRMSNorm: weight * (x * rstd).to(bf16), i.e. the normalized value is rounded to
          // bf16 before the (bf16) product, which is rounded again.
          Tensor n = empty(x.shape(), ct, dev);
          kernels::rms_norm_forward(n, rstd, xc, Tensor(), eps);
          Tensor nb = n.to(DType::bf16).to(DType::f32);
          if (dev == Device::host && nb.numel() > 0) {
            float* p = nb.data<float>();
            const float* w = wc.contiguous().data<float>();
            const int64_t d = x.size(-1), rows = nb.numel() / d;
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t j = 0; j < d; ++j) p[r * d + j] *= w[j];
          }
          y = nb.to(DType::bf16);
        } else {
          Tensor yc = empty(x.shape(), ct, dev);
          kernels::rms_norm_forward(yc, rstd, xc, wc, eps);
          y = to_dtype(yc, dt);
        }
        const bool need_w = weight.defined() && weight.requires_grad();
        autograd::record(op, {x, weight}, {y},
                         [xk = keep(x, xc), wc, rstd, need_w, dt, ct](const Grads& g) -> Grads {
                           const Tensor xc = compute(xk);
                           Tensor gc = compute(g[0]), dx = empty_like(xc);
                           Tensor dw = need_w ? empty({xc.size(-1)}, ct, xc.device()) : Tensor();
                           kernels::rms_norm_backward(dx, dw, gc, xc, rstd, wc);
                           return {to_dtype(dx, dt), to_dtype(dw, dt)};
                         });
        return y;
      }(),
      [&] {
        return OpCall{{x, weight}, OpAttrs().set("eps", eps)};
      });
}

}  // namespace nxd

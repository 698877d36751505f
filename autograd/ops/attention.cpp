// scaled_dot_product_attention: causal, grouped-query. The output is produced in [B, S, Hq, D]
// memory and returned as its [B, Hq, S, D] view, so the usual transpose(1, 2).reshape(B, S, -1)
// that follows is free. Gradients take the layout of their inputs where BLAS can write it.
#include "nxd/runtime/kernels/attention.h"
#include "nxd/autograd/ops/nn.h"
#include "nxd/autograd/ops/nn_internal.h"

namespace nxd {

using namespace nn_detail;

namespace {

// An uninitialized [B, H, S, D] tensor laid out like x when x is a dense [B, S, H, D] transpose,
// else contiguous.
Tensor empty_like_layout(const Tensor& x, DType dt) {
  if (x.dim() == 4 && !x.is_contiguous() && x.transpose(1, 2).is_contiguous())
    return empty({x.size(0), x.size(2), x.size(1), x.size(3)}, dt, x.device()).transpose(1, 2);
  return empty(x.shape(), dt, x.device());
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    double scale) {
  const char* op = "scaled_dot_product_attention";
  check_float(op, "q", q);
  check_float(op, "k", k);
  check_float(op, "v", v);
  const DType dt = q.dtype(), ct = compute_dtype(dt);
  NXD_CHECK(k.dtype() == dt && v.dtype() == dt, "[", op, "] dtypes differ: q=", q.desc(),
            " k=", k.desc(), " v=", v.desc());
  NXD_CHECK_SHAPE(q.dim() == 4, "[", op, "] q must be [B, Hq, S, D], got ", q.desc());
  const Device dev = device_of({q, k, v});
  Tensor qc = compute(q), kc = compute(k), vc = compute(v);
  Tensor oc = empty({q.size(0), q.size(2), q.size(1), q.size(3)}, ct, dev).transpose(1, 2);
  const bool grad = autograd::needs_grad({q, k, v});
  Tensor probs = grad ? empty({q.size(0), q.size(1), q.size(2), k.size(2)}, ct, dev) : Tensor();
  kernels::attention_forward(oc, probs, qc, kc, vc, causal, scale);
  Tensor out = to_dtype(oc, dt);  // oc itself for f32/f64: captured detached below
  if (!grad) return out;
  // bf16 attention keeps bf16 inputs, output and probabilities for backward (half the bytes;
  // the output and probabilities rounded, as PyTorch's bf16 attention keeps them), f32 keeps f32
  const bool half = dt == DType::bf16;
  autograd::record(
      op, {q, k, v}, {out},
      [qk = keep(q, qc), kk = keep(k, kc), vk = keep(v, vc), ok = half ? out.detach() : oc.detach(),
       pk = half ? probs.to(DType::bf16) : probs, causal, scale, dt](const Grads& g) -> Grads {
        const Tensor qc = compute(qk), kc = compute(kk), vc = compute(vk);
        const Tensor oc = compute(ok), probs = compute(pk);
        Tensor dq = empty_like_layout(qc, qc.dtype());
        Tensor dk = empty_like_layout(kc, qc.dtype());
        Tensor dv = empty_like_layout(vc, qc.dtype());
        kernels::attention_backward(dq, dk, dv, compute(g[0]), qc, kc, vc, oc, probs, causal,
                                    scale);
        return {to_dtype(dq, dt), to_dtype(dk, dt), to_dtype(dv, dt)};
      });
  return out;
}

}  // namespace nxd

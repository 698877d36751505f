// scaled_dot_product_attention: causal, grouped-query, fused (FlashAttention-style) or
// materialized. The output is produced in [B, S, Hq, D] memory and returned as its [B, Hq, S, D]
// view, so the usual transpose(1, 2).reshape(B, S, -1) that follows is free. Gradients take the
// layout of their inputs where BLAS can write it.
#include <array>

#include "nxd/autograd/ops/nn.h"
#include "nxd/autograd/ops/nn_internal.h"
#include "nxd/runtime/kernels/attention.h"
#include "nxd/runtime/kernels/flash_attention.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

using namespace nn_detail;

namespace {

struct Prepared {
  DType dt;
  Device dev;
  Tensor qc, kc, vc, oc;  // compute-dtype inputs and the [B, S, Hq, D]-memory output
  bool grad;
};

Prepared prepare(const Tensor& q, const Tensor& k, const Tensor& v) {
  const char* op = "scaled_dot_product_attention";
  check_float(op, "q", q);
  check_float(op, "k", k);
  check_float(op, "v", v);
  const DType dt = q.dtype(), ct = compute_dtype(dt);
  NXD_CHECK(k.dtype() == dt && v.dtype() == dt, "[", op, "] dtypes differ: q=", q.desc(),
            " k=", k.desc(), " v=", v.desc());
  NXD_CHECK_SHAPE(q.dim() == 4, "[", op, "] q must be [B, Hq, S, D], got ", q.desc());
  const Device dev = device_of({q, k, v});
  Tensor oc = empty({q.size(0), q.size(2), q.size(1), q.size(3)}, ct, dev).transpose(1, 2);
  return {dt, dev, compute(q), compute(k), compute(v), oc, autograd::needs_grad({q, k, v})};
}

// The three gradient buffers in their inputs' layouts.
std::array<Tensor, 3> grad_buffers(const Tensor& qc, const Tensor& kc, const Tensor& vc) {
  return {empty_like_layout(qc, qc.dtype()), empty_like_layout(kc, qc.dtype()),
          empty_like_layout(vc, qc.dtype())};
}

Tensor materialized(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  Prepared p = prepare(q, k, v);
  Tensor probs =
      p.grad ? empty({q.size(0), q.size(1), q.size(2), k.size(2)}, p.oc.dtype(), p.dev) : Tensor();
  {
    const kernels::AttentionPricing priced(p.dt);  // bf16 inputs: priced at the bf16 rate
    kernels::attention_forward(p.oc, probs, p.qc, p.kc, p.vc, causal, scale);
  }
  Tensor out = to_dtype(p.oc, p.dt);  // oc itself for f32/f64: captured detached below
  if (!p.grad) return out;
  // bf16 attention keeps bf16 inputs, output and probabilities for backward (half the bytes;
  // the output and probabilities rounded, as PyTorch's bf16 attention keeps them), f32 keeps f32
  const bool half = p.dt == DType::bf16;
  autograd::record(
      "scaled_dot_product_attention", {q, k, v}, {out},
      [qk = keep(q, p.qc), kk = keep(k, p.kc), vk = keep(v, p.vc),
       ok = half ? out.detach() : p.oc.detach(), pk = half ? probs.to(DType::bf16) : probs, causal,
       scale, dt = p.dt](const Grads& g) -> Grads {
        const Tensor qc = compute(qk), kc = compute(kk), vc = compute(vk);
        auto [dq, dk, dv] = grad_buffers(qc, kc, vc);
        const kernels::AttentionPricing priced(dt);
        kernels::attention_backward(dq, dk, dv, compute(g[0]), qc, kc, vc, compute(ok), compute(pk),
                                    causal, scale);
        return {to_dtype(dq, dt), to_dtype(dk, dt), to_dtype(dv, dt)};
      });
  return out;
}

// The fused kernel; with `positions` (packed documents) its document-masked form, causal.
Tensor fused(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
             int64_t window, const Tensor& positions = Tensor()) {
  NXD_CHECK(!positions.defined() || window == 0,
            "[document_attention] packed documents with a sliding window (", window,
            ") are not supported");
  Prepared p = prepare(q, k, v);
  Tensor lse = p.grad ? empty({q.size(0), q.size(1), q.size(2)}, p.oc.dtype(), p.dev) : Tensor();
  const Tensor pos = positions.defined() ? positions.detach() : Tensor();
  {
    const kernels::AttentionPricing priced(p.dt);  // bf16 inputs: priced at the bf16 rate
    if (pos.defined())
      kernels::flash_document_attention_forward(p.oc, lse, p.qc, p.kc, p.vc, pos, scale);
    else
      kernels::flash_attention_forward(p.oc, lse, p.qc, p.kc, p.vc, causal, scale, window);
  }
  Tensor out = to_dtype(p.oc, p.dt);
  if (!p.grad) return out;
  // bf16 keeps bf16 inputs and output (rounded) and the f32 log-sum-exp
  const bool half = p.dt == DType::bf16;
  autograd::record(pos.defined() ? "document_attention" : "scaled_dot_product_attention", {q, k, v},
                   {out},
                   [qk = keep(q, p.qc), kk = keep(k, p.kc), vk = keep(v, p.vc),
                    ok = half ? out.detach() : p.oc.detach(), lse, pos, causal, scale, window,
                    dt = p.dt](const Grads& g) -> Grads {
                     const Tensor qc = compute(qk), kc = compute(kk), vc = compute(vk);
                     auto [dq, dk, dv] = grad_buffers(qc, kc, vc);
                     const kernels::AttentionPricing priced(dt);
                     if (pos.defined())
                       kernels::flash_document_attention_backward(dq, dk, dv, compute(g[0]), qc, kc,
                                                                  vc, compute(ok), lse, pos, scale);
                     else
                       kernels::flash_attention_backward(dq, dk, dv, compute(g[0]), qc, kc, vc,
                                                         compute(ok), lse, causal, scale, window);
                     return {to_dtype(dq, dt), to_dtype(dk, dt), to_dtype(dv, dt)};
                   });
  return out;
}

}  // namespace

Tensor document_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& positions, double scale) {
  // no replay entry: tracing a model that packs documents fails naming this op
  OpScope scope_("document_attention");
  return scope_.out(fused(q, k, v, /*causal=*/true, scale, 0, positions), [&] {
    return OpCall{{q, k, v, positions}, OpAttrs().set("scale", scale)};
  });
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SdpaOptions& opts) {
  OpScope scope_("sdpa");
  NXD_CHECK(opts.window == 0 || opts.impl == AttentionImpl::fused,
            "[scaled_dot_product_attention] a sliding window (", opts.window,
            ") needs the fused implementation");
  return scope_.out(
      [&]() -> Tensor {
        return opts.impl == AttentionImpl::fused
                   ? fused(q, k, v, opts.causal, opts.scale, opts.window)
                   : materialized(q, k, v, opts.causal, opts.scale);
      }(),
      [&] {
        OpAttrs a = OpAttrs()
                        .set("causal", int64_t(opts.causal))
                        .set("scale", opts.scale)
                        .set("impl", int64_t(opts.impl));
        if (opts.window > 0) a.set("window", opts.window);  // traces without one keep their form
        return OpCall{{q, k, v}, a};
      });
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    double scale) {
  OpScope scope_("sdpa");
  return scope_.out([&]() -> Tensor { return fused(q, k, v, causal, scale, 0); }(),
                    [&] {
                      return OpCall{{q, k, v},
                                    OpAttrs()
                                        .set("causal", int64_t(causal))
                                        .set("scale", scale)
                                        .set("impl", int64_t(AttentionImpl::fused))};
                    });
}

}  // namespace nxd

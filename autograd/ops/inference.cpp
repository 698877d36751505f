// The forward-only ops of the KV-cache path (autograd/ops/inference.h).
#include "nxd/autograd/ops/inference.h"

#include "nxd/autograd/ops/nn_internal.h"
#include "nxd/runtime/kernels/kv_cache.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

using namespace nn_detail;

namespace {
void no_grad(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    NXD_CHECK(!t->defined() || !t->requires_grad(), "[", op, "] is forward-only, but input ",
              t->desc(), " requires grad (run the KV-cache path under NoGradGuard)");
}
using AttentionKernel = void (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, const Tensor&, const Tensor&, double);

// cached_attention and paged_attention: `where` is seq_ids or block_tables.
Tensor attention_op(const char* op, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                    const Tensor& where, const Tensor& start, const Tensor& lengths, double scale,
                    AttentionKernel kernel) {
  OpScope scope_(op);
  no_grad(op, {&q, &k_cache, &v_cache});
  check_float(op, "q", q);
  NXD_CHECK(k_cache.dtype() == q.dtype(), "[", op, "] q ", q.desc(), " and cache ", k_cache.desc(),
            " dtypes differ");
  NXD_CHECK_SHAPE(q.dim() == 4, "[", op, "] q must be [B, Hq, S, D], got ", q.desc());
  Tensor qc = compute(q);
  const Device dev = device_of({q, k_cache, v_cache});
  Tensor oc = empty({q.size(0), q.size(2), q.size(1), q.size(3)}, qc.dtype(), dev).transpose(1, 2);
  kernel(oc, qc, k_cache.detach(), v_cache.detach(), where, start, lengths, scale);
  return scope_.out(to_dtype(oc, q.dtype()), [&] {
    return OpCall{{q, k_cache, v_cache, where, start, lengths}, OpAttrs().set("scale", scale)};
  });
}

}  // namespace

void kv_cache_write(const Tensor& cache, const Tensor& x, const Tensor& seq_ids,
                    const Tensor& start, const Tensor& lengths) {
  OpScope scope_("kv_cache_write");
  no_grad("kv_cache_write", {&cache, &x});
  kernels::kv_cache_write(cache.detach(), x.detach(), seq_ids, start, lengths);
  scope_.outs({}, [&] { return OpCall{{cache, x, seq_ids, start, lengths}, OpAttrs()}; });
}

Tensor rotary_at(const Tensor& x, const Tensor& start, const RotaryOptions& opts) {
  OpScope scope_("rotary_at");
  no_grad("rotary_at", {&x});
  check_float("rotary_at", "input", x);
  Tensor xc = compute(x);
  Tensor yc;
  if (xc.dim() == 4 && !xc.is_contiguous() && xc.transpose(1, 2).is_contiguous())
    yc = empty({xc.size(0), xc.size(2), xc.size(1), xc.size(3)}, xc.dtype(), xc.device())
             .transpose(1, 2);
  else
    yc = empty(xc.shape(), xc.dtype(), xc.device());
  kernels::rotary_at_forward(yc, xc, start, opts.rotary_dim, opts.base, opts.scaling);
  return scope_.out(to_dtype(yc, x.dtype()), [&] {
    return OpCall{{x, start}, rotary_attrs(opts)};
  });
}

Tensor cached_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& seq_ids, const Tensor& start, const Tensor& lengths,
                        double scale) {
  return attention_op("cached_attention", q, k_cache, v_cache, seq_ids, start, lengths, scale,
                      &kernels::cached_attention_forward);
}

void paged_kv_cache_write(const Tensor& cache, const Tensor& x, const Tensor& block_tables,
                          const Tensor& start, const Tensor& lengths) {
  OpScope scope_("paged_kv_cache_write");
  no_grad("paged_kv_cache_write", {&cache, &x});
  kernels::paged_kv_cache_write(cache.detach(), x.detach(), block_tables, start, lengths);
  scope_.outs({}, [&] { return OpCall{{cache, x, block_tables, start, lengths}, OpAttrs()}; });
}

Tensor paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                       const Tensor& block_tables, const Tensor& start, const Tensor& lengths,
                       double scale) {
  return attention_op("paged_attention", q, k_cache, v_cache, block_tables, start, lengths, scale,
                      &kernels::paged_attention_forward);
}

Tensor gather_last(const Tensor& h, const Tensor& lengths) {
  OpScope scope_("gather_last");
  no_grad("gather_last", {&h});
  NXD_CHECK_SHAPE(h.dim() == 3, "[gather_last] h must be [B, S, H], got ", h.desc());
  Tensor out = empty({h.size(0), h.size(2)}, h.dtype(), h.device());
  kernels::gather_last_forward(out, h.detach(), lengths);
  return scope_.out(out, [&] { return OpCall{{h, lengths}, OpAttrs()}; });
}

}  // namespace nxd

// rotary: HF rotate-half rotary embeddings; the backward rotates the gradient by -theta.
#include "nxd/runtime/kernels/rotary.h"
#include "nxd/autograd/ops/nn.h"
#include "nxd/autograd/ops/nn_internal.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

using namespace nn_detail;

OpAttrs rotary_attrs(const RotaryOptions& o) {
  const RopeScaling& r = o.scaling;
  return OpAttrs()
      .set("rotary_dim", o.rotary_dim)
      .set("base", o.base)
      .set("position_offset", o.position_offset)
      .set("scaling", static_cast<int64_t>(r.kind))
      .set("scaling_factor", r.factor)
      .set("low_freq_factor", r.low_freq_factor)
      .set("high_freq_factor", r.high_freq_factor)
      .set("original_max_position_embeddings", r.original_max_position_embeddings);
}

RotaryOptions rotary_options_from(const OpAttrs& a) {
  RotaryOptions o;
  o.rotary_dim = a.i("rotary_dim");
  o.base = a.f("base");
  o.position_offset = a.has("position_offset") ? a.i("position_offset") : 0;
  const int64_t kind = a.i("scaling");
  NXD_CHECK(kind >= 0 && kind <= static_cast<int64_t>(RopeScaling::Kind::llama3),
            "[rotary] unknown rope scaling kind ", kind);
  o.scaling.kind = static_cast<RopeScaling::Kind>(kind);
  o.scaling.factor = a.f("scaling_factor");
  o.scaling.low_freq_factor = a.f("low_freq_factor");
  o.scaling.high_freq_factor = a.f("high_freq_factor");
  o.scaling.original_max_position_embeddings = a.i("original_max_position_embeddings");
  return o;
}

Tensor rotary(const Tensor& x, const RotaryOptions& opts) {
  OpScope scope_("rotary");
  return scope_.out(
      [&]() -> Tensor {
        check_float("rotary", "input", x);
        const DType dt = x.dtype();
        Tensor xc = compute(x), yc = empty_like_layout(xc, xc.dtype());
        kernels::rotary_forward(yc, xc, opts.rotary_dim, opts.base, opts.position_offset,
                                kernels::RotaryDirection::forward, opts.scaling);
        Tensor y = to_dtype(yc, dt);
        autograd::record("rotary", {x}, {y}, [opts, dt](const Grads& g) -> Grads {
          Tensor gc = compute(g[0]), dx = empty_like_layout(gc, gc.dtype());
          kernels::rotary_forward(dx, gc, opts.rotary_dim, opts.base, opts.position_offset,
                                  kernels::RotaryDirection::inverse, opts.scaling);
          return {to_dtype(dx, dt)};
        });
        return y;
      }(),
      [&] {
        return OpCall{{x}, rotary_attrs(opts)};
      });
}

Tensor rotary_at_positions(const Tensor& x, const Tensor& positions, const RotaryOptions& opts) {
  // no replay entry: tracing a model that packs documents fails naming this op
  OpScope scope_("rotary_at_positions");
  NXD_CHECK(opts.position_offset == 0, "[rotary_at_positions] position_offset ",
            opts.position_offset, " must be 0: the positions are given per token");
  return scope_.out(
      [&]() -> Tensor {
        check_float("rotary_at_positions", "input", x);
        const DType dt = x.dtype();
        const Tensor pos = positions.detach();
        Tensor xc = compute(x), yc = empty_like_layout(xc, xc.dtype());
        kernels::rotary_positions_forward(yc, xc, pos, opts.rotary_dim, opts.base,
                                          kernels::RotaryDirection::forward, opts.scaling);
        Tensor y = to_dtype(yc, dt);
        autograd::record("rotary_at_positions", {x}, {y}, [opts, dt, pos](const Grads& g) -> Grads {
          Tensor gc = compute(g[0]), dx = empty_like_layout(gc, gc.dtype());
          kernels::rotary_positions_forward(dx, gc, pos, opts.rotary_dim, opts.base,
                                            kernels::RotaryDirection::inverse, opts.scaling);
          return {to_dtype(dx, dt)};
        });
        return y;
      }(),
      [&] {
        return OpCall{{x, positions}, rotary_attrs(opts)};
      });
}

}  // namespace nxd

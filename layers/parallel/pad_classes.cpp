// NxD's generic pad_model (wrapped_classes, pad_hook_fn) on an unsharded model:
// layers/parallel/pad.h.
#include <set>

#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/parallel/pad.h"

namespace nxd {

namespace {

// `t` extended along `dim` by zeros to size * padded / n_heads.
Tensor pad_axis(const Tensor& t, int64_t dim, int64_t padded, int64_t n_heads,
                const std::string& key) {
  const int64_t n = t.size(dim);
  NXD_CHECK(n * padded % n_heads == 0, "[pad_model] ", key, " has ", n, " along dim ", dim, ": ", n,
            " x ", padded, "/", n_heads, " heads is not whole");
  Shape s = t.shape();
  s[dim] = n * padded / n_heads;
  Tensor out = zeros(s, t.dtype());
  out.narrow(dim, 0, n).copy_(t.detach());
  return out;
}

void pad_parallel_linear(Module& m, const std::string& name, int64_t padded, int64_t n_heads,
                         StateDict& state) {
  const std::string prefix = name.empty() ? "" : name + ".";
  auto pad_key = [&](const std::string& key, int64_t dim) {
    if (const Tensor* t = state.find(prefix + key))
      state.set(prefix + key, pad_axis(*t, dim, padded, n_heads, prefix + key));
  };
  auto* layer = dynamic_cast<ParallelLinearBase*>(&m);
  if (!layer) return;
  NXD_CHECK(layer->tp_size() == 1, "[pad_model] ", m.type_name(), " '", name, "' is sharded over ",
            layer->tp_size(), " ranks: pad_model pads an unsharded model (build it at TP 1)");
  if (auto* col = dynamic_cast<ColumnParallelLinear*>(&m)) {
    NXD_CHECK(col->stride() == 1, "[pad_model] ColumnParallelLinear '", name, "' has stride ",
              col->stride(), ": padding the end of fused parts would mix them");
    pad_key("weight", 0);
    pad_key("bias", 0);
  } else if (dynamic_cast<RowParallelLinear*>(&m)) {
    pad_key("weight", 1);  // the bias is not sharded (as NxD)
  }
}

void pad_helper(Module& m, const std::string& name, bool should_pad,
                const std::vector<ModuleClass>& wrapped, int64_t padded, int64_t n_heads,
                double ratio, const PadHookFn& hook, StateDict& state) {
  for (auto& [child, c] : m.named_children()) {
    bool wraps = should_pad;
    for (const ModuleClass& cls : wrapped) wraps = wraps || cls.matches(*c);
    pad_helper(*c, name.empty() ? child : name + "." + child, wraps, wrapped, padded, n_heads,
               ratio, hook, state);
  }
  if (!should_pad) return;
  if (hook) hook(PadHookArgs{m, name, ratio, state});
  pad_parallel_linear(m, name, padded, n_heads, state);
}

}  // namespace

StateDict pad_model(Module& model, int64_t tp_degree, int64_t n_heads,
                    const std::vector<ModuleClass>& wrapped_classes, const PadHookFn& pad_hook_fn) {
  const int64_t padded = n_heads + get_number_of_extra_heads(n_heads, tp_degree);
  for (const ModuleClass& cls : wrapped_classes) require_instances(model, cls, "pad_model");
  StateDict state = model.state_dict();
  bool should_pad = wrapped_classes.empty();
  for (const ModuleClass& cls : wrapped_classes) should_pad = should_pad || cls.matches(model);
  pad_helper(model, "", should_pad, wrapped_classes, padded, n_heads,
             static_cast<double>(padded) / static_cast<double>(n_heads), pad_hook_fn, state);
  return state;
}

}  // namespace nxd

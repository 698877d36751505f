#include "nxd/layers/parallel/pad.h"

#include <algorithm>
#include <optional>

#include "nxd/autograd/graph.h"

namespace nxd {

int64_t get_number_of_extra_heads(int64_t num_heads, int64_t tp) {
  NXD_CHECK(num_heads > 0 && tp > 0,
            "[get_number_of_extra_heads] need num_heads > 0 and tp > 0, got ", num_heads, " and ",
            tp);
  return (tp - num_heads % tp) % tp;
}

HeadPadding plan_head_padding(int64_t h, int64_t hkv, int64_t tp) {
  NXD_CHECK(h > 0 && hkv > 0 && tp > 0 && h % hkv == 0,
            "[plan_head_padding] need heads > 0 divisible by kv heads > 0 and tp > 0, got heads=",
            h, " kv_heads=", hkv, " tp=", tp);
  HeadPadding p;
  p.num_heads = h;
  p.num_kv_heads = hkv;
  const int64_t g = h / hkv;
  int64_t hkv2, g2;
  if (hkv == h) {
    hkv2 = h + get_number_of_extra_heads(h, tp);
    g2 = 1;
  } else {
    hkv2 = hkv;
    while (hkv2 % tp != 0 && tp % hkv2 != 0) ++hkv2;
    g2 = g;
    while ((hkv2 * g2) % tp != 0) ++g2;
  }
  p.padded_kv_heads = hkv2;
  p.padded_heads = hkv2 * g2;
  for (int64_t j = 0; j < hkv2; ++j) p.kv_source.push_back(j < hkv ? j : -1);
  for (int64_t q = 0; q < p.padded_heads; ++q) {
    const int64_t j = q / g2, i = q % g2;
    p.q_source.push_back(j < hkv && i < g ? j * g + i : -1);
  }
  return p;
}

AttentionOptions pad_attention_options(const AttentionOptions& o, const HeadPadding& plan) {
  AttentionOptions r = o;
  const int64_t d = o.head_dim > 0 ? o.head_dim : o.hidden_size / o.num_heads;
  r.head_dim = d;
  r.num_heads = plan.padded_heads;
  r.num_kv_heads = plan.padded_kv_heads;
  return r;
}

namespace {

// Rearranges blocks of `block` along dim: out block b = in block src[b], or zeros if src[b] < 0.
Tensor remap_blocks(const Tensor& t, int64_t dim, int64_t block, const std::vector<int64_t>& src) {
  Shape s = t.shape();
  s[dim] = block * static_cast<int64_t>(src.size());
  Tensor out = zeros(s, t.dtype());
  for (size_t b = 0; b < src.size(); ++b)
    if (src[b] >= 0)
      out.narrow(dim, static_cast<int64_t>(b) * block, block)
          .copy_(t.detach().narrow(dim, src[b] * block, block));
  return out;
}

}  // namespace

StateDict pad_attention_state_dict(const StateDict& state, const std::string& prefix,
                                   const HeadPadding& plan, int64_t d, QkvLayout layout) {
  const char* op = "pad_attention_state_dict";
  StateDict out;
  auto need = [&](const std::string& key) -> const Tensor& {
    NXD_CHECK(state.contains(prefix + key), "[", op, "] missing key ", prefix + key);
    return state.at(prefix + key);
  };
  std::map<std::string, Tensor> padded;
  if (layout == QkvLayout::separate) {
    padded["q_proj.weight"] = remap_blocks(need("q_proj.weight"), 0, d, plan.q_source);
    padded["k_proj.weight"] = remap_blocks(need("k_proj.weight"), 0, d, plan.kv_source);
    padded["v_proj.weight"] = remap_blocks(need("v_proj.weight"), 0, d, plan.kv_source);
    padded["o_proj.weight"] = remap_blocks(need("o_proj.weight"), 1, d, plan.q_source);
    for (const char* b : {"q_proj.bias", "k_proj.bias", "v_proj.bias"})
      if (state.contains(prefix + b))
        padded[b] =
            remap_blocks(state.at(prefix + b), 0, d, b[0] == 'q' ? plan.q_source : plan.kv_source);
  } else {
    NXD_CHECK(plan.num_heads == plan.num_kv_heads && plan.padded_heads == plan.padded_kv_heads, "[",
              op, "] the fused layout needs multi-head attention");
    padded["query_key_value.weight"] =
        remap_blocks(need("query_key_value.weight"), 0, 3 * d, plan.q_source);
    if (state.contains(prefix + "query_key_value.bias"))
      padded["query_key_value.bias"] =
          remap_blocks(state.at(prefix + "query_key_value.bias"), 0, 3 * d, plan.q_source);
    padded["dense.weight"] = remap_blocks(need("dense.weight"), 1, d, plan.q_source);
  }
  for (const auto& [k, t] : state) {
    auto it = k.compare(0, prefix.size(), prefix) == 0 ? padded.find(k.substr(prefix.size()))
                                                       : padded.end();
    out.insert(k, it != padded.end() ? it->second : t);
  }
  return out;
}

StateDict pad_model(Module& model, int64_t tp, HeadPadding* plan_out) {
  StateDict state = model.state_dict();
  HeadPadding plan;
  bool first = true;
  for (auto& [name, m] : model.named_modules()) {
    auto* a = dynamic_cast<CausalSelfAttention*>(m);
    if (!a) continue;
    if (first) {
      plan = plan_head_padding(a->num_heads(), a->num_kv_heads(), tp);
      first = false;
    }
    NXD_CHECK(a->num_heads() == plan.num_heads && a->num_kv_heads() == plan.num_kv_heads,
              "[pad_model] attention ", name, " has ", a->num_heads(), "/", a->num_kv_heads(),
              " heads, others ", plan.num_heads, "/", plan.num_kv_heads);
    if (plan.needed())
      state = pad_attention_state_dict(state, name.empty() ? "" : name + ".", plan, a->head_dim(),
                                       a->layout());
  }
  if (plan_out) *plan_out = plan;
  return state;
}

Tensor head_padding_mask(const HeadPadding& plan, int64_t head_dim) {
  Tensor m = zeros({plan.padded_heads * head_dim});
  for (int64_t q = 0; q < plan.padded_heads; ++q)
    if (plan.q_source[q] >= 0) m.narrow(0, q * head_dim, head_dim).fill_(1.0);
  return m;
}

ModelConfig pad_model_config(const ModelConfig& cfg, int64_t tp, HeadPadding* plan) {
  const HeadPadding p = plan_head_padding(cfg.num_attention_heads, cfg.kv_heads(), tp);
  if (plan) *plan = p;
  if (!p.needed()) return cfg;
  ModelConfig c = cfg;
  c.attention_head_dim = cfg.head_dim();
  c.num_attention_heads = p.padded_heads;
  c.num_kv_heads = p.padded_kv_heads;
  c.kv_size_multiplier = std::max<int64_t>(1, tp / p.padded_kv_heads);
  return c;
}

namespace {

// Which heads a parameter of an attention module indexes, along which dim, in blocks of what.
struct HeadAxis {
  int64_t dim = 0, block = 0;
  const std::vector<int64_t>* source = nullptr;  // padded head -> original (-1: padded)
};

std::optional<HeadAxis> head_axis(const std::string& name, int64_t d, QkvLayout layout,
                                  const HeadPadding& plan) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  if (layout == QkvLayout::separate) {
    if (starts("q_proj.")) return HeadAxis{0, d, &plan.q_source};
    if (starts("k_proj.") || starts("v_proj.")) return HeadAxis{0, d, &plan.kv_source};
    if (name == "o_proj.weight") return HeadAxis{1, d, &plan.q_source};
  } else {
    if (starts("query_key_value.")) return HeadAxis{0, 3 * d, &plan.q_source};
    if (name == "dense.weight") return HeadAxis{1, d, &plan.q_source};
  }
  return std::nullopt;
}

// 0 for the local elements along ax.dim that belong to padded heads, 1 elsewhere ([size(dim)]).
std::vector<char> keep_mask(const Tensor& t, const ParamInit& init, const HeadAxis& ax) {
  const int64_t n = t.size(ax.dim);
  const int64_t start = init.region ? init.region->start.at(static_cast<size_t>(ax.dim)) : 0;
  std::vector<char> keep(static_cast<size_t>(n), 1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t head = (start + i) / ax.block;
    if (head >= static_cast<int64_t>(ax.source->size()) || (*ax.source)[head] < 0) keep[i] = 0;
  }
  return keep;
}

void zero_where(const Tensor& t, int64_t dim, const std::vector<char>& keep) {
  for (size_t i = 0; i < keep.size(); ++i)
    if (!keep[i]) t.narrow(dim, static_cast<int64_t>(i), 1).zero_();
}

}  // namespace

int zero_padded_heads(Module& model, const HeadPadding& plan) {
  if (!plan.needed()) return 0;
  NoGradGuard ng;
  int count = 0;
  for (auto& [mname, m] : model.named_modules()) {
    auto* a = dynamic_cast<CausalSelfAttention*>(m);
    if (!a) continue;
    NXD_CHECK(a->num_heads() == plan.padded_heads && a->num_kv_heads() == plan.padded_kv_heads,
              "[zero_padded_heads] attention ", mname, " has ", a->num_heads(), "/",
              a->num_kv_heads(), " heads, the plan pads to ", plan.padded_heads, "/",
              plan.padded_kv_heads);
    ++count;
    for (auto& [pname, t] : a->named_parameters()) {
      const auto ax = head_axis(pname, a->head_dim(), a->layout(), plan);
      if (!ax) continue;
      const std::vector<char> keep = keep_mask(t, a->param_init(pname), *ax);
      if (!t.is_meta()) zero_where(t.detach(), ax->dim, keep);
      if (ax->dim != 1) continue;  // the output projection: keep its padded columns untrained
      autograd::register_hook(t, [keep, dim = ax->dim](const Tensor& leaf) {
        Tensor g = leaf.grad();
        if (g.defined() && !g.is_meta()) {
          NoGradGuard ng;
          zero_where(g, dim, keep);
        }
      });
    }
  }
  return count;
}

}  // namespace nxd

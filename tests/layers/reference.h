#pragma once
// Naive double-precision references for the model families, written with raw loops from the
// formulas in layers/models/{llama,gpt_neox}.h and read from a state dict, so they check the
// parameter names and layouts as well as the math.
#include <cmath>
#include <string>
#include <vector>

#include "nxd/layers/models/config.h"
#include "nxd/layers/module.h"

namespace nxd::ref {

using Vec = std::vector<double>;

// Rotary on the first r features of one head vector x[D] at position pos (rotate-half pairs).
inline void rotary(double* x, int64_t r, int64_t pos, double base) {
  for (int64_t i = 0; i < r / 2; ++i) {
    double ang = static_cast<double>(pos) * std::pow(base, -2.0 * static_cast<double>(i) / r);
    double c = std::cos(ang), s = std::sin(ang);
    double x1 = x[i], x2 = x[i + r / 2];
    x[i] = x1 * c - x2 * s;
    x[i + r / 2] = x2 * c + x1 * s;
  }
}

// GPT-NeoX's fused projection [N, H, 3D] (each head's [q|k|v]) -> q, k, v [N, H, D].
inline void split_fused_qkv(const Vec& qkv, int64_t N, int64_t H, int64_t D, Vec& q, Vec& k,
                            Vec& v) {
  q.resize(N * H * D), k.resize(N * H * D), v.resize(N * H * D);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t e = 0; e < D; ++e) {
        q[(n * H + h) * D + e] = qkv[(n * H + h) * 3 * D + e];
        k[(n * H + h) * D + e] = qkv[(n * H + h) * 3 * D + D + e];
        v[(n * H + h) * D + e] = qkv[(n * H + h) * 3 * D + 2 * D + e];
      }
}

struct Ref {
  const ModelConfig& c;
  const StateDict& sd;
  int64_t B, S;

  Vec p(const std::string& name) const { return sd.at(name).to_vector(); }
  bool has(const std::string& name) const { return sd.contains(name); }

  // x [N, in] -> [N, out] with weight [out, in] and optional bias.
  Vec linear(const Vec& x, int64_t in, const std::string& w, const std::string& b = "") const {
    Vec W = p(w), bias = b.empty() ? Vec() : p(b);
    int64_t out = static_cast<int64_t>(W.size()) / in, n = static_cast<int64_t>(x.size()) / in;
    Vec y(n * out);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < out; ++o) {
        double acc = bias.empty() ? 0.0 : bias[o];
        for (int64_t i = 0; i < in; ++i) acc += x[r * in + i] * W[o * in + i];
        y[r * out + o] = acc;
      }
    return y;
  }
  Vec rms_norm(const Vec& x, const std::string& w) const {
    Vec W = p(w), y(x.size());
    int64_t d = W.size();
    for (size_t r = 0; r < x.size() / d; ++r) {
      double ms = 0;
      for (int64_t i = 0; i < d; ++i) ms += x[r * d + i] * x[r * d + i];
      double inv = 1.0 / std::sqrt(ms / d + c.norm_eps);
      for (int64_t i = 0; i < d; ++i) y[r * d + i] = x[r * d + i] * inv * W[i];
    }
    return y;
  }
  Vec layer_norm(const Vec& x, const std::string& prefix) const {
    Vec W = p(prefix + ".weight"), bias = p(prefix + ".bias"), y(x.size());
    int64_t d = W.size();
    for (size_t r = 0; r < x.size() / d; ++r) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < d; ++i) mean += x[r * d + i];
      mean /= d;
      for (int64_t i = 0; i < d; ++i) var += (x[r * d + i] - mean) * (x[r * d + i] - mean);
      var /= d;
      for (int64_t i = 0; i < d; ++i)
        y[r * d + i] = (x[r * d + i] - mean) / std::sqrt(var + c.norm_eps) * W[i] + bias[i];
    }
    return y;
  }
  // q [B,S,H,D], k/v [B,S,Hkv,D] (already rotated) -> [B,S,H*D]
  Vec attention(const Vec& q, const Vec& k, const Vec& v, int64_t H, int64_t Hkv, int64_t D) const {
    Vec o(B * S * H * D, 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        int64_t g = h / (H / Hkv);
        for (int64_t i = 0; i < S; ++i) {
          Vec sc(i + 1);
          double mx = -1e300;
          for (int64_t j = 0; j <= i; ++j) {
            double s = 0;
            for (int64_t e = 0; e < D; ++e)
              s += q[((b * S + i) * H + h) * D + e] * k[((b * S + j) * Hkv + g) * D + e];
            sc[j] = s / std::sqrt(static_cast<double>(D));
            mx = std::max(mx, sc[j]);
          }
          double z = 0;
          for (auto& s : sc) z += s = std::exp(s - mx);
          for (int64_t j = 0; j <= i; ++j)
            for (int64_t e = 0; e < D; ++e)
              o[((b * S + i) * H + h) * D + e] += sc[j] / z * v[((b * S + j) * Hkv + g) * D + e];
        }
      }
    return o;
  }
  void rotate_all(Vec& x, int64_t heads, int64_t D, int64_t r, int64_t offset = 0) const {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < heads; ++h)
          rotary(&x[((b * S + s) * heads + h) * D], r, s + offset, c.rope_theta);
  }
  static Vec add(const Vec& a, const Vec& b) {
    Vec y(a.size());
    for (size_t i = 0; i < a.size(); ++i) y[i] = a[i] + b[i];
    return y;
  }
  Vec embed(const std::vector<int64_t>& ids, const std::string& w) const {
    Vec E = p(w), h;
    int64_t d = c.hidden_size;
    for (int64_t id : ids) h.insert(h.end(), E.begin() + id * d, E.begin() + (id + 1) * d);
    return h;
  }

  Vec llama(const std::vector<int64_t>& ids) const {
    const int64_t d = c.hidden_size, H = c.num_attention_heads, Hkv = c.kv_heads(), D = d / H;
    Vec h = embed(ids, "model.embed_tokens.weight");
    for (int64_t l = 0; l < c.num_layers; ++l) {
      std::string pre = "model.layers." + std::to_string(l) + ".";
      Vec n = rms_norm(h, pre + "input_layernorm.weight");
      Vec q = linear(n, d, pre + "self_attn.q_proj.weight");
      Vec k = linear(n, d, pre + "self_attn.k_proj.weight");
      Vec v = linear(n, d, pre + "self_attn.v_proj.weight");
      rotate_all(q, H, D, D);
      rotate_all(k, Hkv, D, D);
      h = add(h, linear(attention(q, k, v, H, Hkv, D), H * D, pre + "self_attn.o_proj.weight"));
      n = rms_norm(h, pre + "post_attention_layernorm.weight");
      Vec g = linear(n, d, pre + "mlp.gate_proj.weight"),
          u = linear(n, d, pre + "mlp.up_proj.weight");
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      h = add(h, linear(g, c.ffn_size(), pre + "mlp.down_proj.weight"));
    }
    h = rms_norm(h, "model.norm.weight");
    return linear(h, d, has("lm_head.weight") ? "lm_head.weight" : "model.embed_tokens.weight");
  }

  Vec neox_mlp(const Vec& x, const std::string& pre) const {
    Vec a =
        linear(x, c.hidden_size, pre + "mlp.dense_h_to_4h.weight", pre + "mlp.dense_h_to_4h.bias");
    for (auto& z : a) {
      if (c.gelu_tanh) {
        z = 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
      } else {
        z = 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
      }
    }
    return linear(a, c.ffn_size(), pre + "mlp.dense_4h_to_h.weight",
                  pre + "mlp.dense_4h_to_h.bias");
  }
  Vec neox_attn(const Vec& x, const std::string& pre) const {
    const int64_t d = c.hidden_size, H = c.num_attention_heads, D = d / H, N = B * S;
    Vec qkv = linear(x, d, pre + "attention.query_key_value.weight",
                     pre + "attention.query_key_value.bias");  // [N, H, 3D]
    Vec q, k, v;
    split_fused_qkv(qkv, N, H, D, q, k, v);
    int64_t r = static_cast<int64_t>(D * c.rotary_pct);
    rotate_all(q, H, D, r);
    rotate_all(k, H, D, r);
    return linear(attention(q, k, v, H, H, D), d, pre + "attention.dense.weight",
                  pre + "attention.dense.bias");
  }
  Vec gpt_neox(const std::vector<int64_t>& ids) const {
    Vec h = embed(ids, "gpt_neox.embed_in.weight");
    for (int64_t l = 0; l < c.num_layers; ++l) {
      std::string pre = "gpt_neox.layers." + std::to_string(l) + ".";
      if (c.use_parallel_residual) {
        Vec a = neox_attn(layer_norm(h, pre + "input_layernorm"), pre);
        Vec m = neox_mlp(layer_norm(h, pre + "post_attention_layernorm"), pre);
        h = add(add(h, a), m);
      } else {
        h = add(h, neox_attn(layer_norm(h, pre + "input_layernorm"), pre));
        h = add(h, neox_mlp(layer_norm(h, pre + "post_attention_layernorm"), pre));
      }
    }
    h = layer_norm(h, "gpt_neox.final_layer_norm");
    return linear(h, c.hidden_size,
                  has("embed_out.weight") ? "embed_out.weight" : "gpt_neox.embed_in.weight");
  }
  Vec logits(const std::vector<int64_t>& ids) const {
    return c.arch == "llama" ? llama(ids) : gpt_neox(ids);
  }
};

}  // namespace nxd::ref

#include <gtest/gtest.h>

#include <cmath>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/transformer.h"
#include "reference.h"
#include "support/compare.h"

using namespace nxd;

namespace {

Tensor randn(const Shape& s, uint64_t stream, DType dt = DType::f64, double std = 1.0) {
  Tensor t = empty(s, dt);
  init::normal(t, RngStream{17, stream}, 0.0, std);
  return t;
}

// Gives every parameter of m random values (biases and norm weights included).
void randomize(Module& m, uint64_t seed) {
  NoGradGuard ng;
  for (auto& [k, t] : m.named_parameters())
    init::normal(t.detach(), RngStream{seed, stream_id(k.c_str())}, 0.1, 0.4);
}

}  // namespace

TEST(Layers, LinearEmbeddingAndNormsAgainstFormulas) {
  Linear lin(3, 2, LinearOptions{.param = {DType::f64}});
  randomize(lin, 1);
  Tensor x = randn({4, 3}, 1);
  Tensor y = lin.forward(x);
  auto W = lin.weight().to_vector(), b = lin.bias().to_vector(), xv = x.to_vector();
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t o = 0; o < 2; ++o) {
      double acc = b[o];
      for (int64_t i = 0; i < 3; ++i) acc += xv[r * 3 + i] * W[o * 3 + i];
      EXPECT_NEAR(y.at({r, o}), acc, 1e-14);
    }
  Embedding emb(5, 3, EmbeddingOptions{.param = {DType::f64}});
  randomize(emb, 2);
  Tensor e = emb.forward(from_vector<int64_t>({4, 0, 4}, {3}));
  EXPECT_EQ(e.shape(), (Shape{3, 3}));
  for (int64_t j = 0; j < 3; ++j) {
    EXPECT_EQ(e.at({0, j}), emb.weight().at({4, j}));
    EXPECT_EQ(e.at({1, j}), emb.weight().at({0, j}));
  }
  EXPECT_ANY_THROW(emb.forward(from_vector<int64_t>({5}, {1})));

  ModelConfig c;
  c.norm_eps = 1e-5;
  Tensor h = randn({2, 6}, 3);
  LayerNorm ln(6, LayerNormOptions{.eps = 1e-5, .param = {DType::f64}});
  RMSNorm rms(6, RMSNormOptions{.eps = 1e-5, .param = {DType::f64}});
  randomize(ln, 3);
  randomize(rms, 4);
  StateDict sd;
  for (auto& [k, t] : ln.state_dict()) sd.insert("ln." + k, t);
  for (auto& [k, t] : rms.state_dict()) sd.insert("rms." + k, t);
  ref::Ref r{c, sd, 1, 2};
  EXPECT_CLOSE_REL(ln.forward(h),
                   from_doubles(r.layer_norm(h.to_vector(), "ln"), {2, 6}, DType::f64), 1e-13);
  EXPECT_CLOSE_REL(rms.forward(h),
                   from_doubles(r.rms_norm(h.to_vector(), "rms.weight"), {2, 6}, DType::f64),
                   1e-13);
}

TEST(Layers, DropoutTrainingAndEval) {
  Dropout d(0.5);
  Tensor x = full({1000}, 1.0);
  Tensor y = d.forward(x);
  auto v = y.to_vector();
  int zeros_n = 0;
  for (double a : v) {
    EXPECT_TRUE(a == 0.0 || a == 2.0) << a;
    zeros_n += a == 0.0;
  }
  EXPECT_GT(zeros_n, 400);
  EXPECT_LT(zeros_n, 600);
  d.eval();
  EXPECT_TRUE(d.forward(x).is_same(x));
}

TEST(Layers, GroupedQueryAttentionWithOffsetAndBiasAgainstReference) {
  for (QkvLayout layout : {QkvLayout::separate, QkvLayout::fused_neox}) {
    AttentionOptions o;
    o.hidden_size = 12;
    o.num_heads = 4;
    o.num_kv_heads = layout == QkvLayout::separate ? 2 : 4;
    o.head_dim = 4;  // explicit: 4 * 4 != 12 is allowed
    o.rotary_dim = layout == QkvLayout::separate ? 4 : 2;
    o.rope_theta = 50.0;
    o.bias = true;
    o.layout = layout;
    o.param.dtype = DType::f64;
    CausalSelfAttention attn(o);
    randomize(attn, 5);
    const int64_t B = 2, S = 5, offset = 3;
    Tensor x = randn({B, S, 12}, 6);
    Tensor got = attn.forward(x, offset);
    EXPECT_EQ(got.shape(), (Shape{B, S, 12}));

    ModelConfig c;
    c.rope_theta = 50.0;
    StateDict sd = attn.state_dict();
    ref::Ref r{c, sd, B, S};
    auto xv = x.to_vector();
    const int64_t H = 4, Hkv = o.num_kv_heads, D = 4, N = B * S;
    ref::Vec q, k, v;
    if (layout == QkvLayout::separate) {
      q = r.linear(xv, 12, "q_proj.weight", "q_proj.bias");
      k = r.linear(xv, 12, "k_proj.weight", "k_proj.bias");
      v = r.linear(xv, 12, "v_proj.weight", "v_proj.bias");
    } else {
      ref::split_fused_qkv(r.linear(xv, 12, "query_key_value.weight", "query_key_value.bias"), N, H,
                           D, q, k, v);
    }
    r.rotate_all(q, H, D, o.rotary_dim, offset);
    r.rotate_all(k, Hkv, D, o.rotary_dim, offset);
    std::string out = layout == QkvLayout::separate ? "o_proj" : "dense";
    ref::Vec want =
        r.linear(r.attention(q, k, v, H, Hkv, D), H * D, out + ".weight", out + ".bias");
    EXPECT_CLOSE_REL(got, from_doubles(want, {B, S, 12}, DType::f64), 1e-13);
  }
  AttentionOptions bad;
  bad.hidden_size = 12;
  bad.num_heads = 4;
  bad.num_kv_heads = 3;
  EXPECT_THROW(CausalSelfAttention{bad}, InvalidArgument);
  bad.num_kv_heads = 2;
  bad.layout = QkvLayout::fused_neox;
  EXPECT_THROW(CausalSelfAttention{bad}, InvalidArgument);
}

TEST(Layers, MlpsAgainstFormulas) {
  Tensor x = randn({3, 4}, 9);
  auto xv = x.to_vector();
  GatedMlp g(4, 6, GatedMlpOptions{.param = {DType::f64}});
  Mlp m(4, 6, MlpOptions{.param = {DType::f64}});
  randomize(g, 1);
  randomize(m, 2);
  ModelConfig c;
  c.gelu_tanh = false;
  c.hidden_size = 4;
  c.ffn_hidden_size = 6;
  StateDict sd;
  for (auto& [k, t] : g.state_dict()) sd.insert("g." + k, t);
  for (auto& [k, t] : m.state_dict()) sd.insert("mlp." + k, t);
  ref::Ref r{c, sd, 1, 3};
  ref::Vec gate = r.linear(xv, 4, "g.gate_proj.weight"), up = r.linear(xv, 4, "g.up_proj.weight");
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
  EXPECT_CLOSE_REL(g.forward(x),
                   from_doubles(r.linear(gate, 6, "g.down_proj.weight"), {3, 4}, DType::f64),
                   1e-13);
  EXPECT_CLOSE_REL(m.forward(x), from_doubles(r.neox_mlp(xv, ""), {3, 4}, DType::f64), 1e-13);
}

TEST(Layers, MetaModelGivesShapesOnly) {
  // GPT-2-124M-like sizes on the meta device: shapes and parameter counts, no memory.
  for (std::string arch : {"llama", "gpt_neox"}) {
    ModelConfig c;
    c.arch = arch;
    c.vocab_size = 50257;
    c.hidden_size = 768;
    c.num_layers = 12;
    c.num_attention_heads = 12;
    c.ffn_hidden_size = 3072;
    c.device = Device::meta;
    auto m = make_causal_lm(c, 1);
    const int64_t per_layer = arch == "llama"
                                  ? 4 * 768 * 768 + 3 * 768 * 3072 + 2 * 768
                                  : 4 * 768 * 768 + 4 * 768 + 2 * 768 * 3072 + 3072 + 768 + 4 * 768;
    const int64_t final_norm = arch == "llama" ? 768 : 2 * 768;
    EXPECT_EQ(m->num_parameters(), 2 * 50257 * 768 + 12 * per_layer + final_norm) << arch;
    Tensor ids = zeros({4, 64}, DType::i64, Device::meta);
    Tensor loss = m->loss(ids, ids);
    EXPECT_TRUE(loss.is_meta());
    EXPECT_EQ(m->forward(ids).shape(), (Shape{4, 64, 50257}));
    backward(loss);
    EXPECT_EQ(m->parameters().back().grad().shape(), m->parameters().back().shape());
  }
}

TEST(Layers, Bf16ModelTracksF32) {
  for (std::string arch : {"llama", "gpt_neox"}) {
    ModelConfig c;
    c.arch = arch;
    c.vocab_size = 32;
    c.hidden_size = 32;
    c.num_layers = 2;
    c.num_attention_heads = 4;
    c.ffn_hidden_size = 64;
    c.init_std = 0.2;
    auto m32 = make_causal_lm(c, 3);
    c.dtype = DType::bf16;
    auto m16 = make_causal_lm(c, 3);
    Tensor ids = from_vector<int64_t>({1, 5, 9, 2, 31, 0, 7, 7}, {2, 4});
    Tensor l16 = m16->forward(ids);
    EXPECT_EQ(l16.dtype(), DType::bf16);
    EXPECT_CLOSE_REL(l16, m32->forward(ids), 0.05) << arch;
    Tensor loss = m16->loss(ids, ids);
    backward(loss);
    EXPECT_EQ(m16->parameters()[0].grad().dtype(), DType::bf16);
  }
}

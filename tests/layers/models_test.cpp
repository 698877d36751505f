#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/models/gpt_neox.h"
#include "nxd/layers/models/llama.h"
#include "reference.h"
#include "support/compare.h"
#include "support/tiny_models.h"

using namespace nxd;

namespace {

ModelConfig tiny(const std::string& arch, DType dt = DType::f32) {
  ModelConfig c = nxd::testing::micro_model(arch);
  c.vocab_size = 13;
  c.num_kv_heads = arch == "llama" ? 2 : 0;
  c.max_position_embeddings = 32;
  c.dtype = dt;
  return c;
}

std::vector<int64_t> some_ids(int64_t n, int64_t vocab, uint64_t seed) {
  return nxd::testing::id_sequence(n, vocab, seed);
}

Tensor ids_tensor(const std::vector<int64_t>& v, int64_t B, int64_t S) {
  return from_vector<int64_t>(v, {B, S});
}

std::vector<std::string> names(const Module& m) {
  std::vector<std::string> n;
  for (auto& [k, t] : m.named_parameters()) n.push_back(k);
  return n;
}

std::string config_error(const ModelConfig& c) {
  try {
    c.validate();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ModelConfig, ValidateNamesTheValues) {
  ModelConfig c;
  EXPECT_EQ(config_error(c), "");
  c.num_attention_heads = 5;
  EXPECT_NE(config_error(c).find("num_attention_heads=5 does not divide hidden_size=256"),
            std::string::npos)
      << config_error(c);
  c = ModelConfig{};
  c.num_kv_heads = 3;
  EXPECT_NE(config_error(c).find("num_kv_heads=3 does not divide num_attention_heads=4"),
            std::string::npos)
      << config_error(c);
  c = ModelConfig{};
  c.arch = "";
  EXPECT_NE(config_error(c).find("arch must name the model family"), std::string::npos);
  c.arch = "gpt2";  // a user's own family is a valid config, but make_causal_lm does not build it
  EXPECT_EQ(config_error(c), "");
  try {
    make_causal_lm(c, 1);
    ADD_FAILURE() << "built an unknown arch";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown arch 'gpt2'"), std::string::npos) << e.what();
  }
  c = tiny("gpt_neox");
  c.num_kv_heads = 2;
  EXPECT_NE(config_error(c).find("num_kv_heads=2"), std::string::npos);
  c = tiny("gpt_neox");
  c.rotary_pct = 0.25;  // head_dim 4 -> 1 rotary feature: odd
  EXPECT_NE(config_error(c).find("even"), std::string::npos) << config_error(c);
  c = ModelConfig{};
  c.hidden_size = 0;
  EXPECT_NE(config_error(c).find("hidden_size must be positive, got 0"), std::string::npos);
  EXPECT_THROW(make_causal_lm(c, 0), ConfigError);
  // defaults
  EXPECT_EQ(ModelConfig{}.ffn_size(), 768);
  c = ModelConfig{};
  c.arch = "gpt_neox";
  EXPECT_EQ(c.ffn_size(), 1024);
  EXPECT_EQ(c.rotary_dim(), 16);
}

TEST(Models, LlamaParameterNamesAndShapesMatchHF) {
  ModelConfig c = tiny("llama");
  auto m = make_causal_lm(c, 1);
  std::vector<std::string> expect = {"model.embed_tokens.weight"};
  for (int l = 0; l < 2; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    for (auto s :
         {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"})
      expect.push_back(p + s);
  }
  expect.push_back("model.norm.weight");
  expect.push_back("lm_head.weight");
  EXPECT_EQ(names(*m), expect);
  EXPECT_EQ(m->get_parameter("model.layers.1.self_attn.q_proj.weight").shape(), (Shape{16, 16}));
  EXPECT_EQ(m->get_parameter("model.layers.1.self_attn.k_proj.weight").shape(), (Shape{8, 16}));
  EXPECT_EQ(m->get_parameter("model.layers.0.mlp.down_proj.weight").shape(), (Shape{16, 24}));
  EXPECT_EQ(m->get_parameter("lm_head.weight").shape(), (Shape{13, 16}));
  c.tie_word_embeddings = true;
  auto tied = make_causal_lm(c, 1);
  expect.pop_back();
  EXPECT_EQ(names(*tied), expect);
  EXPECT_EQ(tied->num_parameters(), m->num_parameters() - 13 * 16);
}

TEST(Models, GPTNeoXParameterNamesAndShapesMatchHF) {
  auto m = make_causal_lm(tiny("gpt_neox"), 1);
  std::vector<std::string> expect = {"gpt_neox.embed_in.weight"};
  for (int l = 0; l < 2; ++l) {
    std::string p = "gpt_neox.layers." + std::to_string(l) + ".";
    for (auto s : {"input_layernorm.weight", "input_layernorm.bias",
                   "post_attention_layernorm.weight", "post_attention_layernorm.bias",
                   "attention.query_key_value.weight", "attention.query_key_value.bias",
                   "attention.dense.weight", "attention.dense.bias", "mlp.dense_h_to_4h.weight",
                   "mlp.dense_h_to_4h.bias", "mlp.dense_4h_to_h.weight", "mlp.dense_4h_to_h.bias"})
      expect.push_back(p + s);
  }
  expect.push_back("gpt_neox.final_layer_norm.weight");
  expect.push_back("gpt_neox.final_layer_norm.bias");
  expect.push_back("embed_out.weight");
  EXPECT_EQ(names(*m), expect);
  EXPECT_EQ(m->get_parameter("gpt_neox.layers.0.attention.query_key_value.weight").shape(),
            (Shape{48, 16}));
  EXPECT_EQ(m->get_parameter("gpt_neox.layers.0.mlp.dense_h_to_4h.weight").shape(),
            (Shape{24, 16}));
}

TEST(Models, OutputShapesAndInitialLoss) {
  for (std::string arch : {"llama", "gpt_neox"}) {
    ModelConfig c = tiny(arch);
    c.init_std = 0.02;
    auto m = make_causal_lm(c, 3);
    auto v = some_ids(3 * 7, c.vocab_size, 1);
    Tensor ids = ids_tensor(v, 3, 7);
    Tensor logits = m->forward(ids);
    EXPECT_EQ(logits.shape(), (Shape{3, 7, 13})) << arch;
    EXPECT_EQ(m->hidden_states(ids).shape(), (Shape{3, 7, 16})) << arch;
    Tensor loss = m->loss(ids, ids);
    EXPECT_EQ(loss.numel(), 1);
    // small init: nearly uniform predictions
    EXPECT_NEAR(loss.item(), std::log(13.0), 0.05) << arch;
    // loss = mean over non-ignored targets of -log softmax(logits)[target], by hand
    Tensor tg = ids.clone();
    tg.set({0, 0}, -100);
    tg.set({2, 6}, -100);
    double want = 0;
    int count = 0;
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t s = 0; s < 7; ++s) {
        int64_t t = static_cast<int64_t>(tg.at({b, s}));
        if (t == -100) continue;
        double mx = -1e300, z = 0;
        for (int64_t v = 0; v < 13; ++v) mx = std::max(mx, logits.at({b, s, v}));
        for (int64_t v = 0; v < 13; ++v) z += std::exp(logits.at({b, s, v}) - mx);
        want += -(logits.at({b, s, t}) - mx - std::log(z));
        ++count;
      }
    EXPECT_NEAR(m->loss(ids, tg).item(), want / count, 1e-6) << arch;
    EXPECT_THROW(m->loss(ids, ids_tensor(some_ids(7, 13, 2), 1, 7)), ShapeError);
    EXPECT_THROW(m->forward(ids_tensor(some_ids(33, 13, 2), 1, 33)), InvalidArgument);
  }
}

TEST(Models, MatchHandComputedReference) {
  for (std::string arch : {"llama", "gpt_neox"}) {
    for (int variant = 0; variant < 2; ++variant) {
      ModelConfig c = tiny(arch, DType::f64);
      if (variant == 1) {  // the other options: tied embeddings, sequential residual, tanh gelu
        c.tie_word_embeddings = true;
        c.use_parallel_residual = false;
        c.gelu_tanh = true;
        c.num_kv_heads = arch == "llama" ? 1 : 0;
        c.rope_theta = 500.0;
      }
      auto m = make_causal_lm(c, 11);
      const int64_t B = 2, S = 6;
      auto v = some_ids(B * S, c.vocab_size, 5);
      Tensor got = m->forward(ids_tensor(v, B, S));
      StateDict sd = m->state_dict();
      ref::Ref r{c, sd, B, S};
      Tensor want = from_doubles(r.logits(v), {B, S, c.vocab_size}, DType::f64);
      EXPECT_CLOSE_REL(got, want, 1e-12) << arch << " variant " << variant;
      // the same model in f32 (same parameters rounded) within f32 accuracy
      ModelConfig c32 = c;
      c32.dtype = DType::f32;
      auto m32 = make_causal_lm(c32, 11);
      EXPECT_CLOSE_REL(m32->forward(ids_tensor(v, B, S)), want, 2e-5) << arch;
    }
  }
}

TEST(Models, AttentionRotaryAgainstClosedForm) {
  // One head, D = 4, all-rotary: the attention score between positions i and j must equal the
  // closed form q^T R(theta*(j - i)) k, i.e. depend only on the offset; checked through
  // nxd::rotary directly against the 2x2 rotation formula, with a position offset.
  const int64_t D = 8, S = 5;
  Tensor x = empty({1, 2, S, D}, DType::f64);
  init::normal(x, RngStream{3, 4}, 0, 1);
  for (int64_t rd : {8, 4}) {
    RotaryOptions o;
    o.rotary_dim = rd;
    o.base = 100.0;
    o.position_offset = 3;
    Tensor y = rotary(x, o);
    auto xv = x.to_vector();
    std::vector<double> want = xv;
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t s = 0; s < S; ++s) ref::rotary(&want[(h * S + s) * D], rd, s + 3, 100.0);
    EXPECT_CLOSE_REL(y, from_doubles(want, {1, 2, S, D}, DType::f64), 1e-14) << "rotary_dim " << rd;
    // closed form of the first pair at position p: (x0 cos p - x_{r/2} sin p, ...)
    double p = 3 + 2;  // s = 2
    double x0 = x.at({0, 0, 2, 0}), xh = x.at({0, 0, 2, rd / 2});
    EXPECT_NEAR(y.at({0, 0, 2, 0}), x0 * std::cos(p) - xh * std::sin(p), 1e-14);
    EXPECT_NEAR(y.at({0, 0, 2, rd / 2}), xh * std::cos(p) + x0 * std::sin(p), 1e-14);
    // features past rotary_dim pass through
    if (rd < D) {
      EXPECT_EQ(y.at({0, 1, 4, D - 1}), x.at({0, 1, 4, D - 1}));
    }
  }
  // relative property: <rot(q, m), rot(k, n)> depends only on m - n
  Tensor q = empty({1, 1, 1, D}, DType::f64), k = empty({1, 1, 1, D}, DType::f64);
  init::normal(q, RngStream{5, 1}, 0, 1);
  init::normal(k, RngStream{5, 2}, 0, 1);
  auto dot_at = [&](int64_t m, int64_t n) {
    RotaryOptions om, on;
    om.position_offset = m;
    on.position_offset = n;
    auto a = rotary(q, om).to_vector(), b = rotary(k, on).to_vector();
    double s = 0;
    for (int64_t i = 0; i < D; ++i) s += a[i] * b[i];
    return s;
  };
  EXPECT_NEAR(dot_at(7, 3), dot_at(4, 0), 1e-12);
  EXPECT_NEAR(dot_at(10, 12), dot_at(0, 2), 1e-12);
}

TEST(Models, StateDictRoundTripIsExact) {
  for (std::string arch : {"llama", "gpt_neox"}) {
    ModelConfig c = tiny(arch);
    auto a = make_causal_lm(c, 1), b = make_causal_lm(c, 2);
    Tensor ids = ids_tensor(some_ids(2 * 5, 13, 3), 2, 5);
    Tensor la = a->forward(ids);
    EXPECT_FALSE(nxd::testing::bitwise_equal(la, b->forward(ids)));
    StateDict snapshot;
    for (auto& [k, t] : a->state_dict()) snapshot.insert(k, t.clone());
    EXPECT_TRUE(b->load_state_dict(snapshot).ok());
    for (auto& [k, t] : snapshot) EXPECT_BITWISE_EQ(b->get_parameter(k).detach(), t) << k;
    EXPECT_BITWISE_EQ(b->forward(ids), la) << arch;
    // loading into the other family names every unexpected and missing key
    auto other = make_causal_lm(tiny(arch == "llama" ? "gpt_neox" : "llama"), 1);
    LoadResult r = other->load_state_dict(snapshot, /*strict=*/false);
    EXPECT_EQ(r.unexpected_keys.size(), snapshot.size());
    EXPECT_EQ(r.missing_keys.size(), other->state_dict().size());
  }
}

TEST(Models, InitDependsOnlyOnSeedAndName) {
  ModelConfig c = tiny("llama");
  auto a = make_causal_lm(c, 7), b = make_causal_lm(c, 7);
  for (auto& [k, t] : a->state_dict()) EXPECT_BITWISE_EQ(b->get_parameter(k).detach(), t) << k;
  // a deeper model shares the values of every parameter with the same name
  ModelConfig deep = c;
  deep.num_layers = 3;
  auto d = make_causal_lm(deep, 7);
  for (auto& [k, t] : a->state_dict()) EXPECT_BITWISE_EQ(d->get_parameter(k).detach(), t) << k;
  // each weight is normal(0, init_std) from the stream of its own name
  Tensor w = empty({8, 16});
  init::normal(w, RngStream{7, stream_id("model.layers.1.self_attn.k_proj.weight")}, 0.0, 0.3);
  EXPECT_BITWISE_EQ(a->get_parameter("model.layers.1.self_attn.k_proj.weight").detach(), w);
  EXPECT_FALSE(
      nxd::testing::bitwise_equal(a->get_parameter("model.layers.0.self_attn.k_proj.weight"), w));
  EXPECT_EQ(a->get_parameter("model.norm.weight").to_vector(), std::vector<double>(16, 1.0));
  auto n = make_causal_lm(tiny("gpt_neox"), 7);
  EXPECT_EQ(n->get_parameter("gpt_neox.layers.0.attention.dense.bias").to_vector(),
            std::vector<double>(16, 0.0));
}

TEST(Models, SampleTokenRespectsTopK) {
  std::vector<double> logits = {0.1, 2.0, -1.0, 1.5, 2.0, 0.3};
  EXPECT_EQ(sample_token(logits, 0.0, 0, 0.9), 1);  // greedy: first max
  std::map<int64_t, int> counts;
  const int n = 4000;
  for (int i = 0; i < n; ++i) counts[sample_token(logits, 1.0, 3, (i + 0.5) / n)]++;
  std::set<int64_t> seen;
  for (auto& [t, k] : counts) seen.insert(t);
  EXPECT_EQ(seen, (std::set<int64_t>{1, 3, 4}));
  // frequencies follow softmax over the kept three
  double z = std::exp(2.0) * 2 + std::exp(1.5);
  EXPECT_NEAR(counts[3] / double(n), std::exp(1.5) / z, 0.01);
  EXPECT_EQ(sample_token(logits, 1.0, 1, 0.99), 1);
  // very low temperature approaches greedy; top_k >= V means no restriction
  EXPECT_EQ(sample_token(logits, 1e-3, 0, 0.2), 1);
  std::set<int64_t> all;
  for (int i = 0; i < n; ++i) all.insert(sample_token(logits, 1.0, 100, (i + 0.5) / n));
  EXPECT_EQ(all.size(), logits.size());
}

TEST(Models, GenerateGreedyIsDeterministicArgmaxAndSamplingSeeded) {
  for (std::string arch : {"llama", "gpt_neox"}) {
    ModelConfig c = tiny(arch);
    c.max_position_embeddings = 16;  // generation stops there (KVCache.GenerateStops...)
    auto m = make_causal_lm(c, 5);
    std::vector<int64_t> prompt = {1, 2, 3};
    GenerateOptions g;
    g.max_new_tokens = 10;
    g.temperature = 0.0;
    auto out = m->generate(prompt, g);
    ASSERT_EQ(out.size(), 13u);
    EXPECT_EQ(std::vector<int64_t>(out.begin(), out.begin() + 3), prompt);
    EXPECT_EQ(m->generate(prompt, g), out);
    EXPECT_TRUE(m->is_training());  // mode restored
    // the first generated token is the argmax of the logits at the last prompt position
    Tensor logits = m->forward(ids_tensor(prompt, 1, 3));
    std::vector<double> last;
    for (int64_t v = 0; v < c.vocab_size; ++v) last.push_back(logits.at({0, 2, v}));
    EXPECT_EQ(out[3], std::max_element(last.begin(), last.end()) - last.begin());
    // top_k = 1 sampling is greedy
    GenerateOptions k1 = g;
    k1.temperature = 1.0;
    k1.top_k = 1;
    EXPECT_EQ(m->generate(prompt, k1), out);
    // sampling: same seed same tokens; all ids in the vocabulary
    GenerateOptions s = g;
    s.temperature = 1.0;
    s.seed = 9;
    s.max_new_tokens = 20;
    auto s1 = m->generate(prompt, s), s2 = m->generate(prompt, s);
    EXPECT_EQ(s1, s2);
    for (int64_t t : s1) EXPECT_TRUE(t >= 0 && t < c.vocab_size);
    s.seed = 10;
    EXPECT_NE(m->generate(prompt, s), s1);
    // eos stops early
    GenerateOptions e = g;
    e.eos_token_id = out[4];
    size_t stop = std::find(out.begin() + 3, out.end(), out[4]) - out.begin() + 1;
    EXPECT_EQ(m->generate(prompt, e).size(), stop);
    EXPECT_THROW(m->generate({}, g), InvalidArgument);
    EXPECT_THROW(m->generate({13}, g), InvalidArgument);
  }
}

namespace {
// Plain Adam written out, on the raw f32 parameter data.
struct TinyAdam {
  std::vector<Tensor> params;
  std::vector<std::vector<double>> m, v;
  double lr, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  int64_t t = 0;
  TinyAdam(std::vector<Tensor> p, double lr_) : params(std::move(p)), lr(lr_) {
    for (auto& q : params) m.emplace_back(q.numel(), 0.0), v.emplace_back(q.numel(), 0.0);
  }
  void step() {
    ++t;
    NoGradGuard ng;
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor g = params[i].grad();
      if (!g.defined()) continue;
      auto gv = g.to_vector();
      float* p = params[i].detach().data<float>();
      for (size_t j = 0; j < gv.size(); ++j) {
        m[i][j] = b1 * m[i][j] + (1 - b1) * gv[j];
        v[i][j] = b2 * v[i][j] + (1 - b2) * gv[j] * gv[j];
        double mh = m[i][j] / (1 - std::pow(b1, t)), vh = v[i][j] / (1 - std::pow(b2, t));
        p[j] -= static_cast<float>(lr * mh / (std::sqrt(vh) + eps));
      }
    }
  }
};
}  // namespace

TEST(Models, TinyModelOverfitsOneBatch) {
  for (std::string arch : {"llama", "gpt_neox"}) {
    ModelConfig c = tiny(arch);
    c.vocab_size = 32;
    c.hidden_size = 32;
    c.ffn_hidden_size = 64;
    c.init_std = 0.02;
    auto m = make_causal_lm(c, 1);
    const int64_t B = 4, S = 16;
    auto v = some_ids(B * (S + 1), c.vocab_size, 8);
    std::vector<int64_t> in, tg;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        in.push_back(v[b * (S + 1) + s]), tg.push_back(v[b * (S + 1) + s + 1]);
    Tensor ids = ids_tensor(in, B, S), targets = ids_tensor(tg, B, S);
    TinyAdam opt(m->parameters(), 1e-2);
    double first = 0, last = 0;
    for (int step = 0; step < 150; ++step) {
      m->zero_grad();
      Tensor loss = m->loss(ids, targets);
      backward(loss);
      if (step == 0) first = loss.item();
      last = loss.item();
      opt.step();
    }
    EXPECT_NEAR(first, std::log(32.0), 0.05) << arch;
    EXPECT_LT(last, 0.02) << arch << ": loss " << first << " -> " << last;
  }
}

TEST(Models, GradientsMatchFiniteDifferencesInF64) {
  for (std::string arch : {"llama", "gpt_neox"}) {
    ModelConfig c = tiny(arch, DType::f64);
    c.vocab_size = 7;
    c.hidden_size = 8;
    c.num_attention_heads = 2;
    c.num_kv_heads = arch == "llama" ? 1 : 0;
    c.ffn_hidden_size = 12;
    c.rotary_pct = 0.5;
    c.tie_word_embeddings = arch == "llama";  // the tied weight gets both gradients
    c.init_std = 0.5;
    auto m = make_causal_lm(c, 2);
    // perturb the norms and biases so their gradients are generic
    {
      NoGradGuard ng;
      for (auto& [k, t] : m->named_parameters())
        if (k.find("norm") != std::string::npos || k.find("bias") != std::string::npos) {
          Tensor noise = empty_like(t.detach());
          init::normal(noise, RngStream{1, stream_id(k.c_str())}, 0.0, 0.3);
          t.detach().copy_(from_doubles(
              [&] {
                auto a = t.to_vector(), b = noise.to_vector();
                for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
                return a;
              }(),
              t.shape(), DType::f64));
        }
    }
    Tensor ids = ids_tensor(some_ids(2 * 5, 7, 4), 2, 5);
    Tensor tg = ids_tensor(some_ids(2 * 5, 7, 6), 2, 5);
    CrossEntropyOptions ce;
    tg.set({1, 2}, -100);  // an ignored target
    m->zero_grad();
    backward(m->loss(ids, tg, ce));
    double worst = 0;
    std::string where;
    const double eps = 1e-6;
    for (auto& [k, t] : m->named_parameters()) {
      Tensor g = t.grad();
      ASSERT_TRUE(g.defined()) << k;
      double* p = t.detach().data<double>();
      const std::vector<double> gv = g.to_vector();
      for (int64_t i = 0; i < t.numel(); ++i) {
        NoGradGuard ng;
        double orig = p[i];
        p[i] = orig + eps;
        double lp = m->loss(ids, tg, ce).item();
        p[i] = orig - eps;
        double lm = m->loss(ids, tg, ce).item();
        p[i] = orig;
        double num = (lp - lm) / (2 * eps), ana = gv[i];
        // central differences carry ~1e-10 of rounding noise
        double err = std::abs(num - ana) / (1e-8 + 1e-6 * std::abs(num));
        if (err > worst) worst = err, where = str(k, "[", i, "] numeric ", num, " analytic ", ana);
      }
    }
    EXPECT_LT(worst, 1.0) << arch << ": worst " << where;
  }
}

TEST(Models, DropoutOnlyWhileTraining) {
  ModelConfig c = tiny("gpt_neox");
  c.dropout = 0.3;
  auto m = make_causal_lm(c, 1);
  Tensor ids = ids_tensor(some_ids(10, 13, 1), 2, 5);
  m->eval();
  Tensor e1 = m->forward(ids), e2 = m->forward(ids);
  EXPECT_BITWISE_EQ(e1, e2);
  m->train();
  EXPECT_FALSE(nxd::testing::bitwise_equal(m->forward(ids), e1));
}

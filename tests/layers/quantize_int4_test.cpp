// 4-bit group-wise weight-only quantization of a model (layers/quantize.h Int4Weight,
// layers/models/quantize_lm.h): every decoder linear layer runs on its 4-bit weight and equals the
// model with the dequantized weights (both zero points, groups 32/64/128), its quality against
// int8's, TP 2 equal to TP 1 (row-parallel shards quantized on their own: groups never cross
// ranks), and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/models/quantize_lm.h"
#include "nxd/layers/quantize.h"
#include "support/ranks.h"
#include "support/tiny_models.h"

using namespace nxd;
using kernels::Int4Zero;

namespace {

using nxd::testing::quality_model;

std::vector<float> logits_of(CausalLM& m, const std::vector<int64_t>& ids) {
  NoGradGuard g;
  const Tensor t = m.forward(from_vector(ids, {1, static_cast<int64_t>(ids.size())}))
                       .to(DType::f32)
                       .contiguous();
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

std::map<std::string, std::shared_ptr<const Int4Weight>> int4_layers(Module& q) {
  std::map<std::string, std::shared_ptr<const Int4Weight>> out;
  for (auto& [name, m] : q.named_modules())
    if (auto* l = dynamic_cast<QuantizableLinear*>(m); l && l->int4_weight())
      out[name] = l->int4_weight();
  return out;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b, double* mx = nullptr) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(double(a[i]) - b[i]));
    m = std::max(m, std::abs(double(b[i])));
  }
  if (mx) *mx = m;
  return d;
}

QuantizeOptions int4(int64_t group, Int4Zero zero) {
  return QuantizeOptions{.format = WeightQuant::int4, .group = group, .zero = zero};
}

}  // namespace

TEST(QuantizeInt4, EveryDecoderLinearRunsOnItsInt4WeightAsTheDequantizedModel) {
  for (std::string arch : {"llama", "gpt_neox"})
    for (int64_t group : {32, 128})
      for (Int4Zero zero : {Int4Zero::symmetric, Int4Zero::asymmetric}) {
        SCOPED_TRACE(str(arch, " group ", group, zero == Int4Zero::symmetric ? " sym" : " asym"));
        const ModelConfig c = quality_model(arch);
        auto q = make_causal_lm(c, 11), deq = make_causal_lm(c, 11);
        const auto ids = nxd::testing::id_sequence(24, c.vocab_size, 3);
        const QuantizedLmReport r = quantize_causal_lm(*q, {}, int4(group, zero));
        EXPECT_EQ(r.summary.layers, c.num_layers * (arch == "llama" ? 7 : 4));
        const auto layers = int4_layers(*q);
        ASSERT_EQ(static_cast<int64_t>(layers.size()), r.summary.layers);
        int64_t weights = 0;
        for (auto& [name, w] : layers) weights += w->out_features() * w->in_features();
        // half a byte per weight and 4 (asymmetric: 8) bytes per group
        const int64_t per_group = zero == Int4Zero::symmetric ? 4 : 8;
        EXPECT_EQ(r.summary.bytes_after, weights / 2 + per_group * weights / group);
        {
          NoGradGuard g;
          for (auto& [name, w] : layers) {
            const Tensor d = w->dequantize();
            std::memcpy(deq->get_parameter(name + ".weight").data<float>(), d.data<float>(),
                        d.numel() * 4);
          }
        }
        double mx = 0;
        const double diff = max_diff(logits_of(*q, ids), logits_of(*deq, ids), &mx);
        std::printf("    int4 kernels vs dequantized f32 weights: max logit diff %.3g (max %.3g)\n",
                    diff, mx);
        EXPECT_LE(diff, 1e-5 * mx);  // only the order of the f32 sums differs
        const std::vector<int64_t> prompt(ids.begin(), ids.begin() + 5);
        const GenerateOptions greedy{.max_new_tokens = 12, .temperature = 0.0};
        EXPECT_EQ(q->generate(prompt, greedy), deq->generate(prompt, greedy));
      }
}

// 4 bits move each weight by up to scale/2 with a scale ~16x int8's per element range: the logits
// change more than int8's but the model stays close (perplexity, most likely tokens).
TEST(QuantizeInt4, QualityAgainstInt8) {
  const ModelConfig c = quality_model("llama");
  const auto text = nxd::testing::id_sequence(48, c.vocab_size, 5);
  auto a = make_causal_lm(c, 21), b = make_causal_lm(c, 21), d = make_causal_lm(c, 21);
  const QuantizedLmReport r8 = quantize_causal_lm(*a, text);
  const QuantizedLmReport r4 = quantize_causal_lm(*b, text, int4(32, Int4Zero::symmetric));
  const QuantizedLmReport r4a = quantize_causal_lm(*d, text, int4(32, Int4Zero::asymmetric));
  for (auto [name, r] : {std::pair{"int8", &r8}, {"int4:32", &r4}, {"int4:32:asym", &r4a}})
    std::printf(
        "    %s: max logit change %.4g (max |logit| %.3g), argmax agrees at %lld/%lld, "
        "perplexity %.4f -> %.4f, %.2f MB -> %.2f MB\n",
        name, r->max_logit_change, r->max_abs_logit, (long long)r->argmax_agree,
        (long long)r->positions, r->perplexity_before, r->perplexity_after,
        r->summary.bytes_before / 1e6, r->summary.bytes_after / 1e6);
  EXPECT_GT(r4.max_logit_change, r8.max_logit_change);
  EXPECT_LT(r4.summary.bytes_after * 5, r4.summary.bytes_before);  // 0.625 of 4 bytes per weight
  EXPECT_GE(r4.argmax_agree * 10, r4.positions * 8);
  EXPECT_NEAR(r4.perplexity_after, r4.perplexity_before, 0.05 * r4.perplexity_before);
  EXPECT_NEAR(r4a.perplexity_after, r4a.perplexity_before, 0.05 * r4a.perplexity_before);
}

// ":q8" (activations in int8 per 32-input block, integer dot products) is parsed, described and
// carried to every int4 layer, and keeps the model as close to fp32 as int4 with f32 activations
// (perplexity within 5%, the most likely token at 80% of the positions).
TEST(QuantizeInt4, Int8ActivationsParsedCarriedAndClose) {
  const QuantizeOptions o = parse_weight_quant("int4:32:q8");
  EXPECT_EQ(o.act, kernels::Int4Activations::int8_blocks);
  EXPECT_EQ(describe(o), "int4 (groups of 32, symmetric, int8 activations)");
  EXPECT_EQ(describe(parse_weight_quant("int4:64:asym:q8:head")),
            "int4 (groups of 64, asymmetric, int8 activations), head int8");
  EXPECT_EQ(parse_weight_quant("int4:32").act, kernels::Int4Activations::f32);
  for (const char* bad : {"int8:q8", "int4:q8:64", "int4:q8:asym", "int4:q8:q8", "int4:head:q8"})
    EXPECT_THROW(parse_weight_quant(bad), ConfigError) << bad;
  const ModelConfig c = quality_model("llama");
  const auto text = nxd::testing::id_sequence(48, c.vocab_size, 5);
  auto a = make_causal_lm(c, 21), b = make_causal_lm(c, 21);
  const QuantizedLmReport r4 = quantize_causal_lm(*a, text, int4(32, Int4Zero::symmetric));
  const QuantizedLmReport r4q = quantize_causal_lm(*b, text, o);
  const auto layers = int4_layers(*b);
  EXPECT_EQ(static_cast<int64_t>(layers.size()), r4q.summary.layers);
  for (auto& [name, w] : layers)
    EXPECT_EQ(w->layout().act, kernels::Int4Activations::int8_blocks) << name;
  for (auto [name, r] : {std::pair{"int4:32", &r4}, {"int4:32:q8", &r4q}})
    std::printf(
        "    %s: max logit change %.4g (max |logit| %.3g), argmax agrees at %lld/%lld, "
        "perplexity %.4f -> %.4f\n",
        name, r->max_logit_change, r->max_abs_logit, (long long)r->argmax_agree,
        (long long)r->positions, r->perplexity_before, r->perplexity_after);
  EXPECT_GE(r4q.argmax_agree * 10, r4q.positions * 8);
  EXPECT_NEAR(r4q.perplexity_after, r4q.perplexity_before, 0.05 * r4q.perplexity_before);
}

// TP 2: column-parallel layers hold whole rows, row-parallel ones half of each row quantized on
// its own (64 or 128 inputs: groups of 32 and 64 never cross ranks), so every rank holds exactly
// its slice of the TP-1 weight: logits equal TP 1's up to the order of the f32 sums. A group
// that would cross ranks is refused naming the sizes.
TEST(QuantizeInt4, TensorParallelTwoEqualsTpOne) {
  for (std::string arch : {"llama", "gpt_neox"}) {
    SCOPED_TRACE(arch);
    const ModelConfig c = quality_model(arch);
    const auto ids = nxd::testing::id_sequence(20, c.vocab_size, 9);
    auto one = make_causal_lm(c, 31), plain = make_causal_lm(c, 31);
    quantize_causal_lm(*one, {}, int4(64, Int4Zero::asymmetric));
    const auto want = logits_of(*one, ids), unquantized = logits_of(*plain, ids);
    const std::vector<int64_t> prompt(ids.begin(), ids.begin() + 6);
    const GenerateOptions greedy{.max_new_tokens = 12, .temperature = 0.0};
    const auto want_tokens = one->generate(prompt, greedy);
    nxd::testing::run_ranks(2, [&] {
      parallel_state::initialize_model_parallel(2);
      auto tp = make_causal_lm(c, 31);
      quantize_causal_lm(*tp, {}, int4(64, Int4Zero::asymmetric));
      double mx = 0;
      const auto got = logits_of(*tp, ids);
      const double diff = max_diff(got, want, &mx), change = max_diff(got, unquantized);
      if (current_context().rank() == 0)
        std::printf(
            "    %s: TP 2 int4 vs TP 1 int4: max logit diff %.3g (max %.3g); vs "
            "unquantized %.3g\n",
            arch.c_str(), diff, mx, change);
      EXPECT_LE(diff, 1e-5 * mx);
      EXPECT_GT(change, 100 * diff);
      EXPECT_EQ(tp->generate(prompt, greedy), want_tokens);
      auto wide = make_causal_lm(c, 31);
      try {
        quantize_causal_lm(*wide, {}, int4(128, Int4Zero::symmetric));
        ADD_FAILURE() << "a group crossing ranks was accepted";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("not a multiple of the int4 group 128"),
                  std::string::npos)
            << e.what();
      }
      EXPECT_TRUE(int4_layers(*wide).empty()) << "a refused model must be left as it was";
      parallel_state::destroy_model_parallel();
    });
  }
}

TEST(QuantizeInt4, RefusesABadGroupAndGradients) {
  auto m = make_causal_lm(quality_model("llama"), 1);
  EXPECT_THROW(quantize_causal_lm(*m, {}, int4(48, Int4Zero::symmetric)), InvalidArgument);
  EXPECT_TRUE(int4_layers(*m).empty());
  const auto w = Int4Weight::quantize(full({8, 64}, 0.5f, DType::f32), 32, Int4Zero::symmetric);
  Tensor x = full({2, 64}, 1.0f, DType::f32);
  x.set_requires_grad(true);
  EXPECT_THROW(int4_linear(x, *w, Tensor()), InvalidArgument);
}

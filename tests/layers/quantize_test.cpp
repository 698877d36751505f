// int8 weight-only quantization of linear layers (layers/quantize.h, layers/models/quantize_lm.h):
// the op against the dequantized weight and against the half-step bound of the unquantized one,
// every decoder linear layer of a model switched (and nothing else), the quality of a quantized
// Llama, TP 2 against TP 1, and the refusals (experts, gradients; tracing: tests/trace).
#include "nxd/layers/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/models/quantize_lm.h"
#include "nxd/runtime/rng.h"
#include "support/compare.h"
#include "support/ranks.h"
#include "support/tiny_models.h"

using namespace nxd;

namespace {

Tensor uniform(const Shape& s, uint64_t seed, double range) {
  Tensor t = empty(s, DType::f32);
  RngStream r{seed, 3};
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<float>(range * (2 * r.uniform_f64(i) - 1));
  return t;
}

std::vector<float> values_of(const Tensor& t) {
  const Tensor c = t.to(DType::f32).contiguous();
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

using nxd::testing::quality_model;

std::vector<int64_t> some_ids(int64_t n, int64_t vocab, uint64_t seed) {
  return nxd::testing::id_sequence(n, vocab, seed);
}

std::vector<float> logits_of(CausalLM& m, const std::vector<int64_t>& ids) {
  NoGradGuard g;
  return values_of(m.forward(from_vector(ids, {1, static_cast<int64_t>(ids.size())})));
}

// Every quantized layer of q: its name and int8 weight.
std::map<std::string, std::shared_ptr<const Int8Weight>> int8_layers(Module& q) {
  std::map<std::string, std::shared_ptr<const Int8Weight>> out;
  for (auto& [name, m] : q.named_modules())
    if (auto* l = dynamic_cast<QuantizableLinear*>(m); l && l->int8_weight())
      out[name] = l->int8_weight();
  return out;
}

// Sets, in `plain`, the weight of each layer named in `layers` to f(its int8 weight, its values).
template <class F>
void rewrite_weights(Module& plain,
                     const std::map<std::string, std::shared_ptr<const Int8Weight>>& layers,
                     F&& f) {
  NoGradGuard g;
  for (auto& [name, iw] : layers) {
    Tensor w = plain.get_parameter(name + ".weight");
    f(*iw, w.data<float>());
  }
}

}  // namespace

TEST(Int8Linear, MatchesTheDequantizedWeightWithinHalfAStepOfTheOriginal) {
  const int64_t K = 77, N = 45;
  const Tensor w = uniform({N, K}, 1, 0.3), b = uniform({N}, 2, 0.5);
  const auto iw = Int8Weight::quantize(w);
  const Tensor wd = iw->dequantize();
  double worst_deq = 0, worst_ratio = 0;
  for (Shape xs : {Shape{1, K}, Shape{2, 3, K}, Shape{3, 5, K}}) {  // 1, 6 and 15 rows
    SCOPED_TRACE(shape_str(xs));
    const Tensor x = uniform(xs, 3, 1.0);
    NoGradGuard g;
    const auto yq = values_of(int8_linear(x, *iw, b)), yd = values_of(linear(x, wd, b)),
               y = values_of(linear(x, w, b));
    const auto xv = values_of(x), wv = values_of(w);
    const int64_t M = x.numel() / K;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double mag = std::abs(values_of(b)[j]), xsum = 0;
        for (int64_t p = 0; p < K; ++p) {
          mag += std::abs(double(xv[i * K + p]) * wv[j * K + p]);
          xsum += std::abs(double(xv[i * K + p]));
        }
        const double u = 0x1p-24 * (K + 3) * 2 * mag;  // two f32 products of the same terms
        const double d = std::abs(double(yq[i * N + j]) - yd[i * N + j]);
        worst_deq = std::max(worst_deq, d / mag);
        ASSERT_LE(d, u) << "row " << i << " col " << j;
        // each weight moved by at most scale/2: |dy| <= scale/2 sum |x| (+ the rounding above)
        const double bound = iw->scales()[j] / 2 * xsum + u;
        const double e = std::abs(double(yq[i * N + j]) - y[i * N + j]);
        worst_ratio = std::max(worst_ratio, e / bound);
        ASSERT_LE(e, bound) << "row " << i << " col " << j;
      }
  }
  std::printf("    vs dequantized weight: %.3g of sum|xw|; vs original: %.3f of the bound\n",
              worst_deq, worst_ratio);
}

TEST(Int8Linear, Bf16InputIsComputedInF32AndRoundedOnce) {
  const auto iw = Int8Weight::quantize(uniform({33, 40}, 4, 0.2));
  const Tensor x = uniform({3, 40}, 5, 1.0).to(DType::bf16), b = uniform({33}, 6, 0.1);
  NoGradGuard g;
  const Tensor y = int8_linear(x, *iw, b.to(DType::bf16));
  ASSERT_EQ(y.dtype(), DType::bf16);
  const Tensor want = int8_linear(x.to(DType::f32), *iw, b.to(DType::bf16).to(DType::f32));
  EXPECT_BITWISE_EQ(y, want.to(DType::bf16));
}

TEST(Int8Linear, RefusesAnInputThatNeedsAGradient) {
  const auto iw = Int8Weight::quantize(uniform({4, 8}, 7, 0.2));
  Tensor x = uniform({2, 8}, 8, 1.0);
  x.set_requires_grad(true);
  EXPECT_THROW(int8_linear(x, *iw, Tensor()), InvalidArgument);
}

TEST(QuantizeModel, EveryDecoderLinearRunsOnItsInt8WeightAndNothingElseChanges) {
  for (std::string arch : {"llama", "gpt_neox"}) {
    SCOPED_TRACE(arch);
    const ModelConfig c = quality_model(arch);
    auto q = make_causal_lm(c, 11), deq = make_causal_lm(c, 11);
    const auto ids = some_ids(24, c.vocab_size, 3);
    const QuantizedLmReport r = quantize_causal_lm(*q, {});
    // llama: q, k, v, o, gate, up, down; gpt_neox: query_key_value, dense, h_to_4h, 4h_to_h
    EXPECT_EQ(r.summary.layers, c.num_layers * (arch == "llama" ? 7 : 4));
    const auto layers = int8_layers(*q);
    ASSERT_EQ(static_cast<int64_t>(layers.size()), r.summary.layers);
    EXPECT_EQ(layers.count(q->output_head_name()), 0u) << "the output head stays unquantized";
    int64_t weights = 0, rows = 0;
    for (auto& [name, iw] : layers) {
      weights += iw->out_features() * iw->in_features();
      rows += iw->out_features();
    }
    EXPECT_EQ(r.summary.weights, weights);
    EXPECT_EQ(r.summary.bytes_before, 4 * weights);        // f32
    EXPECT_EQ(r.summary.bytes_after, weights + 4 * rows);  // a byte each, an f32 scale per row
    // the same model with each weight replaced by q * scale, through the f32 kernels
    rewrite_weights(*deq, layers, [](const Int8Weight& iw, float* w) {
      const Tensor d = iw.dequantize();
      std::memcpy(w, d.data<float>(), d.numel() * 4);
    });
    const auto a = logits_of(*q, ids), b = logits_of(*deq, ids);
    double diff = 0, mx = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, std::abs(double(a[i]) - b[i]));
      mx = std::max(mx, std::abs(double(b[i])));
    }
    std::printf(
        "    %s: int8 kernels vs dequantized f32 weights: max logit diff %.3g (max |logit| "
        "%.3g)\n",
        arch.c_str(), diff, mx);
    // only the summation order differs (a few f32 roundings per product, u = 6e-8, relative to
    // sums of size ~|logit|, through 4 layers): 1e-5 of the largest logit leaves a wide margin
    EXPECT_LE(diff, 1e-5 * mx);
    // decode steps (one row: the fused GEMV) pick the same tokens as the dequantized weights
    const std::vector<int64_t> prompt(ids.begin(), ids.begin() + 5);
    const GenerateOptions greedy{.max_new_tokens = 16, .temperature = 0.0};
    EXPECT_EQ(q->generate(prompt, greedy), deq->generate(prompt, greedy));
  }
}

TEST(QuantizeModel, Int8LlamaKeepsItsGreedyTokensAndLogitsWithinTheRoundingBound) {
  const ModelConfig c = quality_model("llama");
  auto q = make_causal_lm(c, 21), ref = make_causal_lm(c, 21), half = make_causal_lm(c, 21);
  const auto text = some_ids(48, c.vocab_size, 5);
  const std::vector<int64_t> prompt(text.begin(), text.begin() + 8);
  const GenerateOptions greedy{.max_new_tokens = 24, .temperature = 0.0};
  const auto before = ref->generate(prompt, greedy);
  const QuantizedLmReport r = quantize_causal_lm(*q, text);
  const auto after = q->generate(prompt, greedy);
  size_t same = 0;
  while (same < after.size() && after[same] == before[same]) ++same;
  // The rounding's effect: each weight moved by at most scale/2. The same model with every weight
  // moved by exactly +-scale/2 (random signs) shows what perturbations of that size do to these
  // logits; the rounding errors are spread over [-scale/2, scale/2] (RMS scale/sqrt(12), 0.58 of
  // that model's), so the int8 change must stay below that model's (a margin of 1.7x on the RMS).
  const auto layers = int8_layers(*q);
  uint64_t seed = 0;
  rewrite_weights(*half, layers, [&seed](const Int8Weight& iw, float* w) {
    RngStream s{++seed, 9};
    for (int64_t i = 0; i < iw.out_features(); ++i)
      for (int64_t j = 0; j < iw.in_features(); ++j) {
        const int64_t e = i * iw.in_features() + j;
        w[e] += (s.uniform_f64(e) < 0.5 ? -0.5f : 0.5f) * iw.scales()[i];
      }
  });
  const auto l0 = logits_of(*ref, text), lh = logits_of(*half, text);
  double half_change = 0;
  for (size_t i = 0; i < l0.size(); ++i)
    half_change = std::max(half_change, std::abs(double(lh[i]) - l0[i]));
  std::printf(
      "    int8: max logit change %.4g (max |logit| %.3g; +-scale/2 everywhere: %.4g), argmax "
      "agrees at %lld/%lld positions, perplexity %.4f -> %.4f, greedy: %zu of %zu tokens the "
      "same\n",
      r.max_logit_change, r.max_abs_logit, half_change, (long long)r.argmax_agree,
      (long long)r.positions, r.perplexity_before, r.perplexity_after, same, after.size());
  EXPECT_GT(r.max_logit_change, 0.0) << "quantization changed nothing: is it applied?";
  EXPECT_LE(r.max_logit_change, half_change);
  EXPECT_GE(r.argmax_agree * 10, r.positions * 9) << "the most likely token changed too often";
  EXPECT_GE(same, prompt.size() + 16) << "greedy tokens diverged early";
  EXPECT_NEAR(r.perplexity_after, r.perplexity_before, 0.01 * r.perplexity_before);
}

TEST(QuantizeModel, RefusesWhatItDoesNotCover) {
  ModelConfig moe = quality_model("llama");
  moe.arch = "mixtral";
  moe.moe.num_experts = 2;
  moe.moe.top_k = 1;
  auto m = make_causal_lm(moe, 1);
  try {
    quantize_causal_lm(*m, {});
    FAIL() << "a mixture-of-experts model was quantized";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("does not cover"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(int8_layers(*m).empty()) << "a refused model must be left as it was";
}

// TP 2 holds slices of the TP-1 int8 weights (row-parallel scales over the whole row): the
// logits equal TP 1's quantized model's up to the order of the f32 sums (the partial sums of the
// row-parallel layers), and differ from the unquantized model's by the quantization.
TEST(QuantizeModel, TensorParallelTwoEqualsTpOneWithinRounding) {
  for (std::string arch : {"llama", "gpt_neox"}) {
    SCOPED_TRACE(arch);
    const ModelConfig c = quality_model(arch);
    const auto ids = some_ids(20, c.vocab_size, 9);
    auto one = make_causal_lm(c, 31), plain = make_causal_lm(c, 31);
    quantize_causal_lm(*one, {});
    const auto want = logits_of(*one, ids), unquantized = logits_of(*plain, ids);
    const std::vector<int64_t> prompt(ids.begin(), ids.begin() + 6);
    const GenerateOptions greedy{.max_new_tokens = 12, .temperature = 0.0};
    const auto want_tokens = one->generate(prompt, greedy);
    nxd::testing::run_ranks(2, [&] {
      parallel_state::initialize_model_parallel(2);
      auto tp = make_causal_lm(c, 31);
      const QuantizedLmReport r = quantize_causal_lm(*tp, {});
      EXPECT_EQ(r.summary.layers, c.num_layers * (arch == "llama" ? 7 : 4));
      const auto got = logits_of(*tp, ids);
      double diff = 0, mx = 0, change = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        diff = std::max(diff, std::abs(double(got[i]) - want[i]));
        change = std::max(change, std::abs(double(got[i]) - unquantized[i]));
        mx = std::max(mx, std::abs(double(want[i])));
      }
      if (current_context().rank() == 0)
        std::printf(
            "    %s: TP 2 int8 vs TP 1 int8: max logit diff %.3g (max |logit| %.3g); vs "
            "unquantized %.3g\n",
            arch.c_str(), diff, mx, change);
      // as EveryDecoderLinear...: only the summation order differs
      EXPECT_LE(diff, 1e-5 * mx);
      EXPECT_GT(change, 100 * diff) << "the TP 2 model does not run on its int8 weights";
      EXPECT_EQ(tp->generate(prompt, greedy), want_tokens);
      parallel_state::destroy_model_parallel();
    });
  }
}

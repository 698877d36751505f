// Speculative decoding (layers/models/speculative.h): the acceptance rule reproduces the target's
// distribution, greedy output equals the target's own greedy decoding for every k on Llama and
// GPT-NeoX (with an unrelated draft and with the target as its own draft), seeded sampling is
// reproducible and follows the target's distribution, and bad pairs are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/models/speculative.h"
#include "support/tiny_models.h"

using namespace nxd;

namespace {

ModelConfig target_cfg(const std::string& arch) {
  ModelConfig c = nxd::testing::tiny_model(arch);
  c.max_position_embeddings = 64;
  c.init_std = 0.5;  // peaked enough that greedy ties are not an issue
  return c;
}

ModelConfig draft_cfg(const std::string& arch) {
  ModelConfig c = target_cfg(arch);
  c.num_layers = 1;
  c.hidden_size = 16;
  c.ffn_hidden_size = 24;
  return c;
}

std::vector<double> random_logits(int64_t V, uint64_t seed) {
  RngStream s{seed, 7};
  std::vector<double> l(V);
  for (int64_t i = 0; i < V; ++i) l[i] = 3.0 * s.uniform_f64(i);
  return l;
}

}  // namespace

// P(out = x) = sum_d q(d) [a_d 1{x = d} + (1 - a_d) R(x)] must be p(x): a_d by quadrature over
// u_accept, R over u_residual (the residual does not depend on which d was rejected).
TEST(Speculative, AcceptanceRuleGivesTheTargetDistribution) {
  const int64_t V = 7, N = 20000;
  for (int trial = 0; trial < 3; ++trial) {
    const TokenDistribution p = token_distribution(random_logits(V, 10 + trial), 1.0, 5, 1.0);
    const TokenDistribution q = token_distribution(random_logits(V, 20 + trial), 0.7, 0, 1.0);
    std::vector<double> out(V, 0.0), residual(V, 0.0);
    int64_t rejected_d = -1;
    for (int64_t d = 0; d < V; ++d)
      if (q.prob(d) > p.prob(d)) rejected_d = d;
    ASSERT_GE(rejected_d, 0);
    for (int64_t i = 0; i < N; ++i) {
      bool ok = true;
      const int64_t x = speculative_accept(p, q, rejected_d, 1.0 - 1e-12, (i + 0.5) / N, &ok);
      ASSERT_FALSE(ok);
      residual[x] += 1.0 / N;
    }
    for (int64_t d = 0; d < V; ++d) {
      if (q.prob(d) == 0) continue;
      double a = 0;
      for (int64_t i = 0; i < N; ++i) {
        bool ok = false;
        speculative_accept(p, q, d, (i + 0.5) / N, 0.5, &ok);
        a += ok ? 1.0 / N : 0.0;
      }
      out[d] += q.prob(d) * a;
      for (int64_t x = 0; x < V; ++x) out[x] += q.prob(d) * (1 - a) * residual[x];
    }
    double worst = 0;
    for (int64_t x = 0; x < V; ++x) worst = std::max(worst, std::abs(out[x] - p.prob(x)));
    std::printf("trial %d: largest |P(out=x) - p(x)| %.2e\n", trial, worst);
    EXPECT_LT(worst, 2e-4);
  }
}

TEST(Speculative, SampleTokenIsTheDistributionsDraw) {
  const std::vector<double> l = random_logits(50, 3);
  for (double t : {0.0, 0.5, 1.0})
    for (int64_t k : {0, 1, 7})
      for (double tp : {1.0, 0.6})
        for (int i = 0; i < 40; ++i) {
          const double u = (i + 0.25) / 40;
          EXPECT_EQ(sample_token(l, t, k, tp, u), token_distribution(l, t, k, tp).draw(u));
        }
}

TEST(Speculative, GreedyEqualsTheTargetAloneForEveryK) {
  for (const std::string arch : {"llama", "gpt_neox"}) {
    auto target = make_causal_lm(target_cfg(arch), 11);
    auto draft = make_causal_lm(draft_cfg(arch), 12);
    const std::vector<int64_t> prompt = nxd::testing::id_sequence(9, 64, 5);
    GenerateOptions o;
    o.max_new_tokens = 40;
    o.temperature = 0;
    const std::vector<int64_t> plain = target->generate(prompt, o);
    for (int64_t k : {1, 2, 4, 8}) {
      const SpeculativeResult r = speculative_generate(*target, *draft, prompt, o, {.k = k});
      EXPECT_EQ(r.sequence, plain) << arch << " k=" << k;
      EXPECT_EQ(r.stop, "max_new_tokens");
      std::printf("%s k=%lld: %lld rounds, acceptance %.2f (unrelated draft)\n", arch.c_str(),
                  static_cast<long long>(k), static_cast<long long>(r.rounds), r.acceptance_rate());
      // the target as its own draft: every proposal accepted, k + 1 tokens per round
      const SpeculativeResult self = speculative_generate(*target, *target, prompt, o, {.k = k});
      EXPECT_EQ(self.sequence, plain) << arch << " self k=" << k;
      EXPECT_EQ(self.accepted, self.proposed) << arch << " self k=" << k;
      EXPECT_LE(self.rounds, (o.max_new_tokens + k) / (k + 1)) << arch << " self k=" << k;
    }
  }
}

TEST(Speculative, StopsOnEosAndAtTheContextLimit) {
  auto target = make_causal_lm(target_cfg("llama"), 11);
  auto draft = make_causal_lm(draft_cfg("llama"), 12);
  const std::vector<int64_t> prompt = nxd::testing::id_sequence(9, 64, 5);
  GenerateOptions o;
  o.max_new_tokens = 40;
  o.temperature = 0;
  const std::vector<int64_t> plain = target->generate(prompt, o);
  o.eos_token_id = plain[prompt.size() + 5];  // stops at its first occurrence
  const SpeculativeResult e = speculative_generate(*target, *draft, prompt, o, {.k = 4});
  EXPECT_EQ(e.stop, "eos");
  EXPECT_EQ(e.sequence, target->generate(prompt, o));
  o.eos_token_id = -1;
  o.max_new_tokens = 1000;  // the 64-position context ends it
  const SpeculativeResult c = speculative_generate(*target, *draft, prompt, o, {.k = 8});
  EXPECT_EQ(c.stop, "max_position_embeddings");
  EXPECT_EQ(c.sequence.size(), 64u);
  EXPECT_EQ(c.sequence, target->generate(prompt, o));
}

// Seeded sampling: the same seed gives the same tokens; over many seeds the second generated
// token (given the most frequent first one) follows the target's distribution, not the draft's.
TEST(Speculative, SamplingFollowsTheTargetDistribution) {
  auto target = make_causal_lm(target_cfg("llama"), 11);
  auto draft = make_causal_lm(draft_cfg("llama"), 12);
  const std::vector<int64_t> prompt = nxd::testing::id_sequence(6, 64, 9);
  GenerateOptions o;
  o.max_new_tokens = 2;
  o.temperature = 0.8;
  o.top_k = 6;
  o.seed = 3;
  const SpeculativeResult a = speculative_generate(*target, *draft, prompt, o, {.k = 2});
  const SpeculativeResult b = speculative_generate(*target, *draft, prompt, o, {.k = 2});
  EXPECT_EQ(a.sequence, b.sequence);
  std::map<int64_t, std::map<int64_t, int>> counts;  // first -> second -> count
  const int runs = 3000;
  for (int s = 0; s < runs; ++s) {
    o.seed = 1000 + s;
    const SpeculativeResult r = speculative_generate(*target, *draft, prompt, o, {.k = 2});
    counts[r.sequence[6]][r.sequence[7]]++;
  }
  int64_t first = -1;
  int most = 0;
  for (auto& [t, m] : counts) {
    int n = 0;
    for (auto& [x, c] : m) n += c;
    if (n > most) most = n, first = t;
  }
  std::vector<int64_t> ctx = prompt;
  ctx.push_back(first);
  NoGradGuard ng;
  target->eval();
  draft->eval();
  const auto next_dist = [&](CausalLM& m) {
    const int64_t n = static_cast<int64_t>(ctx.size());
    std::vector<double> l =
        m.forward(from_vector<int64_t>(ctx, {1, n})).select(1, n - 1).to_vector();
    return token_distribution(l, o.temperature, o.top_k, o.top_p);
  };
  const TokenDistribution p = next_dist(*target), q = next_dist(*draft);
  double tv_p = 0, tv_q = 0;
  for (int64_t x = 0; x < 64; ++x) {
    const double f = counts[first].count(x) ? double(counts[first][x]) / most : 0.0;
    tv_p += std::abs(f - p.prob(x)) / 2;
    tv_q += std::abs(f - q.prob(x)) / 2;
  }
  std::printf("second token given %lld (%d of %d runs): TV to the target %.3f, to the draft %.3f\n",
              static_cast<long long>(first), most, runs, tv_p, tv_q);
  // sampling error of <= 6 kept ids over >= ~500 draws: TV ~ 0.04; the draft's is far
  EXPECT_LT(tv_p, 0.08);
  EXPECT_GT(tv_q, tv_p);
}

TEST(Speculative, RefusesAMismatchedPairOrK) {
  auto target = make_causal_lm(target_cfg("llama"), 11);
  ModelConfig dc = draft_cfg("llama");
  dc.vocab_size = 32;
  auto draft = make_causal_lm(dc, 12);
  GenerateOptions o;
  try {
    speculative_generate(*target, *draft, {1, 2}, o);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size 32 differs from the target's 64"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(speculative_generate(*target, *target, {1, 2}, o, {.k = 0}), InvalidArgument);
  EXPECT_THROW(speculative_generate(*target, *target, {1, 99}, o), InvalidArgument);
}

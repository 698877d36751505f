// Per-request sampling (inference/sampling.h) and the streamed text with stop strings
// (inference/text_stream.h).
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "nxd/inference/sampling.h"
#include "nxd/inference/text_stream.h"
#include "nxd/io/tokenizer.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/runtime/rng.h"

using namespace nxd;
using namespace nxd::inference;

namespace {

std::vector<double> logits(int64_t V, uint64_t seed) {
  std::vector<double> v(V);
  RngStream r{seed, 1};
  for (int64_t i = 0; i < V; ++i) v[i] = 2 * r.normal(uint64_t(i));
  return v;
}

}  // namespace

TEST(Sampling, WithoutNewKnobsEqualsGenerateSampleToken) {
  const TokenCounts none;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const auto l = logits(50, seed);
    SamplingParams p;
    p.temperature = 0.7;
    p.top_k = seed % 3 == 0 ? 0 : 10;
    p.top_p = seed % 2 ? 0.8 : 1.0;
    for (int i = 0; i < 10; ++i) {
      const double u = RngStream{seed, 2}.uniform_f64(uint64_t(i));
      EXPECT_EQ(sample_next(l, p, none, u).id, sample_token(l, p.temperature, p.top_k, p.top_p, u));
    }
  }
}

TEST(Sampling, FiltersThatLeaveOneTokenAreGreedy) {
  const TokenCounts none;
  std::vector<double> l = logits(40, 3);
  l[17] = l[5] = 10;  // a tie: the lower id wins
  SamplingParams g;
  g.temperature = 0;
  EXPECT_EQ(sample_next(l, g, none, 0.5).id, 5);
  for (int knob = 0; knob < 3; ++knob) {
    SamplingParams p;
    p.temperature = 1.0;
    if (knob == 0) p.top_k = 1;
    if (knob == 1) p.top_p = 1e-9;
    if (knob == 2) p.min_p = 1.0;  // only the largest (and its tie)
    for (double u : {0.0, 0.3, 0.999}) {
      const int64_t id = sample_next(l, p, none, u).id;
      EXPECT_TRUE(knob == 2 ? (id == 5 || id == 17) : id == 5) << "knob " << knob << " u " << u;
    }
  }
}

TEST(Sampling, MinPKeepsTokensAboveTheFractionOfTheLargest) {
  // probabilities 0.5, 0.3, 0.15, 0.05: min_p 0.5 keeps {0, 1} (0.3 >= 0.25), not 2 (0.15)
  const std::vector<double> l = {std::log(0.5), std::log(0.3), std::log(0.15), std::log(0.05)};
  SamplingParams p;
  p.min_p = 0.5;
  std::set<int64_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(sample_next(l, p, {}, (i + 0.5) / 200).id);
  EXPECT_EQ(seen, (std::set<int64_t>{0, 1}));
}

TEST(Sampling, PenaltiesFollowTransformersAndOpenAI) {
  std::vector<double> l = {2.0, -1.0, 0.5, 0.0};
  TokenCounts c;
  c.add_prompt(0);                         // repetition: 2.0 / 2 = 1.0
  c.add_generated(1), c.add_generated(1);  // repetition -1 * 2 = -2, then -2 - 2*0.5 - 0.25
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0;
  p.frequency_penalty = 0.5;
  p.presence_penalty = 0.25;
  p.logprobs = 4;
  // greedy over {1.0, -3.25, 0.5, 0.0}: id 0; logprobs stay the model's (unpenalized)
  const Sample s = sample_next(l, p, c, 0.0);
  EXPECT_EQ(s.id, 0);
  double z = 0;
  for (double x : l) z += std::exp(x);
  EXPECT_NEAR(s.chosen.logprob, 2.0 - std::log(z), 1e-12);
  ASSERT_EQ(s.top.size(), 4u);
  EXPECT_EQ(s.top[1].id, 2);
  // a penalty that moves the argmax: presence 2 on id 0 (generated) takes it below 0.5
  TokenCounts g;
  g.add_generated(0);
  SamplingParams q;
  q.temperature = 0;
  q.presence_penalty = 2;
  EXPECT_EQ(sample_next(l, q, g, 0.0).id, 2);
}

TEST(TextStream, HoldsBackAPossibleStopPrefixAndStopsBeforeTheString) {
  auto tok = std::make_shared<io::Tokenizer>(
      io::Tokenizer::from_file(std::string(NXD_TOKENIZER_FIXTURES) + "/gpt2.tokenizer.json"));
  auto piece = [&](const std::string& s) { return tok->encode(s); };
  TextStream t(tok, {"<end>", "xyz"});
  EXPECT_EQ(t.push(piece("ab")), "ab");
  EXPECT_EQ(t.push(piece("c<e")), "c");  // "<e" may begin "<end>"
  EXPECT_EQ(t.push(piece("x")), "<e");   // "<ex" cannot begin "<end>"; "x" may begin "xyz"
  EXPECT_FALSE(t.stopped());
  EXPECT_EQ(t.push(piece("q<en")), "xq");
  EXPECT_EQ(t.push(piece("d>tail")), "");
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(t.flush(), "");
  TextStream u(tok, {"<end>"});
  EXPECT_EQ(u.push(piece("12<en")), "12");
  EXPECT_EQ(u.flush(), "<en");  // finished for another reason: the held text is output
  // an unfinished UTF-8 character is held back, then completed
  TextStream v(tok, {});
  const std::vector<int64_t> euro = tok->encode("\xE2\x82\xAC");  // U+20AC
  ASSERT_GE(euro.size(), 1u);
  std::string out;
  for (int64_t id : euro) out += v.push({id});
  EXPECT_EQ(out, "\xE2\x82\xAC");
}

// Batch invariance of the serving engine (docs/design/inference.md, "Batch invariance"): a
// request's tokens and logprobs are bitwise those it gets alone while up to 16 other requests
// (int8 or int4 weights) or 39 (f32) decode beside it.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "engine_util.h"
#include "nxd/inference/engine.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/models/quantize_lm.h"
#include "support/tiny_models.h"

using namespace nxd;
using namespace nxd::inference;
using namespace nxd::inference::testing;

namespace {

// `n` requests (greedy and seeded-sampled in turn, logprobs on) join one per step, so each prefill
// runs as its own call, as it does alone; then all n decode together. Each request's tokens and
// chosen logprobs must be bitwise those of an engine of its own.
void expect_each_request_alone(const std::shared_ptr<CausalLM>& m, int n) {
  const int64_t vocab = m->config().vocab_size;
  std::vector<Request> reqs;
  for (int b = 0; b < n; ++b) {
    SamplingParams sp = b % 2 ? greedy() : sampled();
    sp.seed = 7 + b;
    sp.logprobs = 0;
    // n + 8 tokens: the first request still decodes when the last joins
    reqs.push_back(request(nxd::testing::id_sequence(2 + 3 * (b % 16), vocab, 300 + b), n + 8, sp));
  }
  EngineOptions o;
  o.max_num_seqs = n;
  Engine e(m, nullptr, o);
  Results res;
  std::vector<int64_t> rid;
  int64_t widest = 0;
  for (int64_t step = 0; step < 400; ++step) {
    if (step < n) rid.push_back(e.submit(reqs[step], into(res)));
    if (!e.step()) break;
    widest = std::max(widest, e.stats().running);
  }
  EXPECT_EQ(widest, n);  // all decoded together
  int differ = 0;
  for (int b = 0; b < n; ++b) {
    Engine one(m, nullptr, o);
    Results r1;
    const int64_t id = one.submit(reqs[b], into(r1));
    one.run_until_idle();
    const Got &got = res[rid[b]], &want = r1[id];
    bool same = got.ids == want.ids && got.chosen.size() == want.chosen.size();
    for (size_t t = 0; same && t < want.chosen.size(); ++t)
      if (std::memcmp(&got.chosen[t].logprob, &want.chosen[t].logprob, sizeof(double)) != 0) {
        same = false;
        ADD_FAILURE() << "request " << b << " token " << t << ": logprob " << got.chosen[t].logprob
                      << " batched, " << want.chosen[t].logprob << " alone";
      }
    if (!same) ++differ;
    EXPECT_EQ(got.ids, want.ids) << "request " << b;
  }
  std::printf("    %d requests decoding together: %d differ from alone\n", n, differ);
}

std::shared_ptr<CausalLM> quantized(QuantizeOptions q) {
  auto m = make_causal_lm(few_rows_llama(), 5);
  quantize_causal_lm(*m, {}, q);
  return m;
}

}  // namespace

// int8 linear layers (the head stays f32): 17 requests, so each decodes beside up to 16 others
TEST(EngineBatch, Int8RequestsGetTheirBitsAloneBesideSixteenOthers) {
  expect_each_request_alone(quantized({.format = WeightQuant::int8}), 17);
}

TEST(EngineBatch, Int4RequestsGetTheirBitsAloneBesideSixteenOthers) {
  expect_each_request_alone(quantized({.format = WeightQuant::int4}), 17);
}

// f32 with more decode rows than the few-rows kernel takes at once (runtime/gemv_f32.h:
// kSmallRows = 32)
TEST(EngineBatch, FortyF32DecodeRowsGiveEachRequestItsBitsAlone) {
  expect_each_request_alone(make_causal_lm(few_rows_llama(), 5), 40);
}

// Batch invariance of the serving engine (docs/design/inference.md, "Batch invariance"): a
// request's tokens and logprobs are bitwise those it gets alone while up to 16 other requests
// (bf16, int8 or int4 weights) or 39 (f32) decode beside it, and with PrefillCalls::per_request
// (the default) while others are prefilled in the same step.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
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

// bf16 weights: the bf16 few-rows kernel (runtime/kernels/gemv_bf16.h) takes up to 32 rows, each
// output lanes8::dot of its row rounded once
TEST(EngineBatch, Bf16RequestsGetTheirBitsAloneBesideSixteenOthers) {
  ModelConfig c = few_rows_llama();
  c.dtype = DType::bf16;
  expect_each_request_alone(make_causal_lm(c, 5), 17);
}

// f32 with more decode rows than the few-rows kernel takes at once (runtime/gemv_f32.h:
// kSmallRows = 32)
TEST(EngineBatch, FortyF32DecodeRowsGiveEachRequestItsBitsAlone) {
  expect_each_request_alone(make_causal_lm(few_rows_llama(), 5), 40);
}

// Three requests submitted together, so their prefills share a step: with per-request prefill
// calls (the engine's default) each request's logprobs (the first from its prefill, the rest over
// its K/V) are bitwise those it gets alone, for f32, bf16 and int8 weights and prompts of 5 to 64
// tokens (batched, the [3, S] call gives most of them other last bits: docs/design/inference.md).
TEST(EngineBatch, PerRequestPrefillCallsGiveEachRequestItsBitsAlone) {
  ModelConfig bf16 = few_rows_llama();
  bf16.dtype = DType::bf16;
  for (std::string w : {"f32", "bf16", "int8"}) {
    auto m = w == "int8"   ? quantized({.format = WeightQuant::int8})
             : w == "bf16" ? make_causal_lm(bf16, 5)
                           : make_causal_lm(few_rows_llama(), 5);
    const EngineOptions o;  // the default: a call per request
    ASSERT_EQ(o.prefill_calls, PrefillCalls::per_request);
    for (int64_t S : {5, 12, 20, 33, 40, 47, 64}) {
      SCOPED_TRACE(str(w, " prompt ", S));
      std::vector<Request> reqs;
      for (int b = 0; b < 3; ++b) {
        SamplingParams sp = b == 1 ? sampled() : greedy();
        sp.logprobs = 0;
        const int64_t len = S - (b == 2 ? S / 8 : 0);  // one a little shorter: the same [k, S] call
        reqs.push_back(request(nxd::testing::id_sequence(len, 256, 900 + b), 6, sp));
      }
      Engine e(m, nullptr, o);
      Results res;
      std::vector<int64_t> rid;
      for (const auto& r : reqs) rid.push_back(e.submit(r, into(res)));
      e.step();
      EXPECT_EQ(e.stats().model_calls, 3);
      e.run_until_idle();
      for (int b = 0; b < 3; ++b) {
        Engine one(m, nullptr, o);
        Results r1;
        const int64_t id = one.submit(reqs[b], into(r1));
        one.run_until_idle();
        const Got &got = res[rid[b]], &want = r1[id];
        ASSERT_EQ(got.ids, want.ids) << "request " << b;
        ASSERT_EQ(got.chosen.size(), want.chosen.size());
        for (size_t t = 0; t < want.chosen.size(); ++t)
          ASSERT_EQ(std::memcmp(&got.chosen[t].logprob, &want.chosen[t].logprob, sizeof(double)), 0)
              << "request " << b << " token " << t << ": " << got.chosen[t].logprob << " together, "
              << want.chosen[t].logprob << " alone";
      }
    }
  }
}

// Traced decoders (context encoding + token generation graphs sharing weights and the K/V cache
// state): logits equal the eager KV-cache path bitwise, generated tokens equal, at TP 1/2/4 for
// Llama, GPT-NeoX, Mistral (sliding window 4 over 8-token prompts) and Qwen3 (TP 2 under mpirun
// -np 2); saved-then-loaded decoders generate the same.
#include <gtest/gtest.h>

#include "nxd/layers/models/kv_cache.h"
#include "nxd/trace/decoder.h"
#include "nxd/trace/save_load.h"
#include "support/compare.h"
#include "support/files.h"
#include "trace_util.h"

using namespace nxd;
using namespace nxd::testing;

namespace {

trace::CausalLMFactory factory(const ModelConfig& cfg) {
  return [cfg] { return make_causal_lm(cfg, 7); };
}

struct Eager {
  Tensor prefill, decode;  // logits [1, V]
  std::vector<int64_t> tokens;
};

// On the current rank: prefill of an 8-token prompt, one decode step, and greedy generation.
Eager eager_run(const ModelConfig& cfg, const std::vector<int64_t>& prompt, int64_t L) {
  auto m = make_causal_lm(cfg, 7);
  m->eval();
  NoGradGuard ng;
  KVCache c = m->make_kv_cache(1, L);
  const int64_t P = static_cast<int64_t>(prompt.size());
  Eager e;
  e.prefill =
      m->forward_cached(from_vector<int64_t>(prompt, {1, P}), make_cache_step({0}, {0}, {P}), c);
  e.decode =
      m->forward_cached(from_vector<int64_t>({5}, {1, 1}), make_cache_step({0}, {P}, {1}), c);
  e.tokens = m->generate(prompt, GenerateOptions{.max_new_tokens = 12, .temperature = 0});
  return e;
}

void check_decoder(const std::string& arch, int tp, const std::string& backend) {
  const ModelConfig cfg = trace_config(arch, tp);
  const std::vector<int64_t> prompt = {3, 9, 27, 1, 14, 60, 2, 33};
  Eager e = eager_run(cfg, prompt, cfg.max_position_embeddings);
  trace::DecoderTraceOptions o{.tp_degree = tp,
                               .prefill_buckets = {8, 16, 32},
                               .max_len = cfg.max_position_embeddings,
                               .backend = backend};
  auto d = trace::trace_decoder(factory(cfg), o);
  ASSERT_EQ(d->buckets().size(), 4u);  // three prefill buckets and one decode bucket
  CacheStep s = make_cache_step({0}, {0}, {8});
  Tensor pre = d->forward({from_vector<int64_t>(prompt, {1, 8}), s.seq_ids, s.start, s.lengths})[0];
  EXPECT_BITWISE_EQ(pre, e.prefill);
  CacheStep t = make_cache_step({0}, {8}, {1});
  Tensor dec = d->forward({from_vector<int64_t>({5}, {1, 1}), t.seq_ids, t.start, t.lengths})[0];
  EXPECT_BITWISE_EQ(dec, e.decode);
  auto r =
      trace::traced_generate(*d, {prompt}, GenerateOptions{.max_new_tokens = 12, .temperature = 0});
  EXPECT_EQ(r.sequences.at(0), e.tokens);
  // a prompt padded into a larger bucket gives the same tokens
  std::vector<int64_t> p11 = prompt;
  p11.insert(p11.end(), {4, 4, 8});
  auto m = make_causal_lm(cfg, 7);
  EXPECT_EQ(
      trace::traced_generate(*d, {p11}, GenerateOptions{.max_new_tokens = 6, .temperature = 0})
          .sequences.at(0),
      m->generate(p11, GenerateOptions{.max_new_tokens = 6, .temperature = 0}));
}

}  // namespace

TEST(TraceDecoder, TracedEqualsEagerKvCachePath) {
  for (const std::string arch : {"llama", "gpt_neox", "mistral", "qwen3"})
    for (int tp : {1, 2, 4}) {
      if (tp > max_ranks()) continue;
      SCOPED_TRACE(arch + " tp=" + std::to_string(tp));
      if (under_mpi()) {
        run_ranks(tp, [&] {
          parallel_state::initialize_model_parallel(tp);
          check_decoder(arch, tp, "mpi");
        });
        continue;
      }
      Eager e;
      // eager reference on sim ranks; the traced decoder launches its own
      const ModelConfig cfg = trace_config(arch, tp);
      if (tp == 1) {
        check_decoder(arch, 1, "sim");
        continue;
      }
      std::vector<int64_t> want;
      run_ranks(tp, [&] {
        parallel_state::initialize_model_parallel(tp);
        Eager r = eager_run(cfg, {3, 9, 27, 1, 14, 60, 2, 33}, cfg.max_position_embeddings);
        if (current_context().rank() == 0) e = r;
      });
      trace::DecoderTraceOptions o{.tp_degree = tp, .prefill_buckets = {8, 16}, .max_len = 64};
      auto d = trace::trace_decoder(factory(cfg), o);
      CacheStep s = make_cache_step({0}, {0}, {8});
      const std::vector<int64_t> prompt = {3, 9, 27, 1, 14, 60, 2, 33};
      Tensor pre =
          d->forward({from_vector<int64_t>(prompt, {1, 8}), s.seq_ids, s.start, s.lengths})[0];
      EXPECT_BITWISE_EQ(pre, e.prefill);
      CacheStep t = make_cache_step({0}, {8}, {1});
      Tensor dec =
          d->forward({from_vector<int64_t>({5}, {1, 1}), t.seq_ids, t.start, t.lengths})[0];
      EXPECT_BITWISE_EQ(dec, e.decode);
      auto r = trace::traced_generate(*d, {prompt},
                                      GenerateOptions{.max_new_tokens = 12, .temperature = 0});
      EXPECT_EQ(r.sequences.at(0), e.tokens);
    }
}

TEST(TraceDecoder, SavedAndLoadedDecoderGeneratesTheSame) {
  if (under_mpi()) GTEST_SKIP() << "sim only";
  const ModelConfig cfg = trace_config("llama", 2);
  auto d = trace::trace_decoder(factory(cfg),
                                {.tp_degree = 2, .prefill_buckets = {8, 16}, .max_len = 64});
  const GenerateOptions g{.max_new_tokens = 10, .temperature = 0.8, .top_k = 20, .seed = 3};
  const auto want = trace::traced_generate(*d, {{1, 2, 3, 4, 5}}, g).sequences;
  const auto dir = test_temp_dir("nxd_trace_") / "dec";
  trace::parallel_model_save(*d, dir);
  auto l = trace::parallel_model_load(dir);
  EXPECT_EQ(trace::traced_generate(*l, {{1, 2, 3, 4, 5}}, g).sequences, want);
  EXPECT_THROW(trace::traced_generate(*l, {{1, 2}, {3, 4}}, g), InvalidArgument);  // one cache row
}

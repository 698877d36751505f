#include "nxd/trace/decoder.h"

#include <algorithm>

#include "nxd/layers/models/decode_loop.h"
#include "nxd/layers/models/kv_cache.h"
#include "nxd/layers/quantize.h"

namespace nxd::trace {

ModelFn causal_lm_decoder_fn(CausalLMFactory make, int64_t batch, int64_t max_len) {
  return [make, batch, max_len] {
    std::shared_ptr<CausalLM> m = make();
    m->eval();
    const int64_t L = max_len > 0 ? max_len : m->config().max_position_embeddings;
    auto cache = std::make_shared<KVCache>(m->make_kv_cache(batch, L));
    RankModel rm;
    // the quantized layers' int8/int4 tensors replace their freed (meta) weights
    for (auto& [name, t] : m->named_parameters())
      if (!t.is_meta()) rm.params.emplace_back(name, t);
    for (auto& nt : quantized_tensors(*m)) rm.params.push_back(std::move(nt));
    for (size_t l = 0; l < cache->k.size(); ++l) {
      rm.state.emplace_back(str("k", l), cache->k[l]);
      rm.state.emplace_back(str("v", l), cache->v[l]);
    }
    rm.forward = [m, cache](const std::vector<Tensor>& a) {
      return std::vector<Tensor>{m->forward_cached(a[0], CacheStep{a[1], a[2], a[3]}, *cache)};
    };
    rm.owner =
        std::make_shared<std::pair<std::shared_ptr<CausalLM>, std::shared_ptr<KVCache>>>(m, cache);
    return rm;
  };
}

namespace {
// Valid example inputs of a bucket: rows 0..B-1 of the cache, each with S real tokens at 0.
std::vector<Tensor> decoder_example(const Bucket& b) {
  std::vector<int64_t> seq(b.batch), zero(b.batch, 0), len(b.batch, b.seq);
  for (int64_t i = 0; i < b.batch; ++i) seq[i] = i;
  CacheStep s = make_cache_step(seq, zero, len);
  return {zeros({b.batch, b.seq}, DType::i64), s.seq_ids, s.start, s.lengths};
}
}  // namespace

std::shared_ptr<TensorParallelModel> trace_decoder(CausalLMFactory make,
                                                   const DecoderTraceOptions& o) {
  NXD_CHECK(o.batch >= 1, "[trace_decoder] batch must be >= 1, got ", o.batch);
  int64_t L = o.max_len;
  std::vector<int64_t> prefill = o.prefill_buckets;
  NXD_CHECK(L > 0 || !prefill.empty(), "[trace_decoder] give max_len or prefill buckets");
  if (L <= 0) L = *std::max_element(prefill.begin(), prefill.end());
  if (prefill.empty())
    for (const Bucket& b : BucketConfig::automatic({.max_seq = L}).buckets)
      prefill.push_back(b.seq);
  std::vector<Bucket> buckets;
  for (int64_t s : prefill) {
    NXD_CHECK(s >= 1 && s <= L, "[trace_decoder] prefill bucket ", s, " is outside [1, max_len=", L,
              "]");
    if (s > 1) buckets.push_back({o.batch, s});
  }
  for (int64_t n = 1; n <= o.batch; ++n) buckets.push_back({n, 1});
  TraceOptions t;
  t.tp_degree = o.tp_degree;
  t.bucket_config = BucketConfig::explicit_shapes(buckets);
  t.workdir = o.workdir;
  t.args = o.args;
  t.max_parallel_compilations = o.max_parallel_compilations;
  t.backend = o.backend;
  t.bucket_example = decoder_example;
  t.pad_batch = false;
  return parallel_model_trace(causal_lm_decoder_fn(std::move(make), o.batch, L),
                              decoder_example({o.batch, 1}), t);
}

GenerateResult traced_generate(TensorParallelModel& model,
                               const std::vector<std::vector<int64_t>>& prompts,
                               const GenerateOptions& opts) {
  const char* op = "traced_generate";
  NXD_CHECK(!model.ranks().empty() && !model.ranks()[0].state.empty(), "[", op,
            "] the model is not a traced decoder (no KV cache state)");
  const Tensor& k0 = model.ranks()[0].state[0].second;
  const int64_t batch = k0.size(0), max_pos = k0.size(2);
  const int64_t B = static_cast<int64_t>(prompts.size());
  NXD_CHECK(B >= 1 && B <= batch, "[", op, "] ", B, " prompts for a decoder of ", batch,
            " cache rows");
  for (int64_t b = 0; b < B; ++b) {
    NXD_CHECK(!prompts[b].empty(), "[", op, "] prompt ", b, " is empty");
    // longer than the KV cache: nothing can be generated (was 0 tokens and a false "stopped")
    NXD_CHECK(static_cast<int64_t>(prompts[b].size()) <= max_pos, "[", op, "] prompt ", b, " has ",
              prompts[b].size(), " tokens, more than the traced decoder's ", max_pos,
              " positions (its max_position_embeddings)");
  }
  // the prefill runs the decoder's whole batch of rows (rows without a prompt repeat prompt 0 in
  // their own cache row and are ignored)
  return decode_loop(prompts, opts, {.max_pos = max_pos, .prefill_rows = batch},
                     [&](const Tensor& ids, const CacheStep& st) {
                       return model.forward({ids, st.seq_ids, st.start, st.lengths})[0];
                     });
}

}  // namespace nxd::trace

// CausalLM's KV-cache path (make_kv_cache, forward_cached) and generation on top of it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "nxd/autograd/ops/inference.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/models/decode_loop.h"
#include "nxd/runtime/rng.h"
#include "nxd/runtime/sim/clock.h"

namespace nxd {

namespace {
// One K and one V of `shape` per layer: zeros on the host, meta tensors for a meta model.
void fill_kv(KVCache& c, const ModelConfig& cfg, const Shape& shape) {
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const bool meta = cfg.device == Device::meta;
    c.k.push_back(meta ? empty(shape, cfg.dtype, Device::meta) : zeros(shape, cfg.dtype));
    c.v.push_back(meta ? empty(shape, cfg.dtype, Device::meta) : zeros(shape, cfg.dtype));
  }
}
}  // namespace

int64_t CausalLM::cache_kv_heads() const {
  const int64_t hkv = cfg_.arch == "gpt_neox" ? cfg_.num_attention_heads : cfg_.kv_heads();
  return tp_size_ == 1 ? hkv : hkv * cfg_.kv_size_multiplier / tp_size_;
}

KVCache CausalLM::make_kv_cache(int64_t max_batch, int64_t max_len) const {
  check_whole("make_kv_cache");
  NXD_CHECK(max_batch >= 1 && max_len >= 1 && max_len <= cfg_.max_position_embeddings, "[",
            type_name(), "::make_kv_cache] need max_batch >= 1 and 1 <= max_len <= ",
            "max_position_embeddings=", cfg_.max_position_embeddings, ", got max_batch=", max_batch,
            " max_len=", max_len);
  KVCache c;
  c.max_batch = max_batch;
  c.max_len = max_len;
  const Shape shape{max_batch, cache_kv_heads(), max_len, cfg_.head_dim()};
  fill_kv(c, cfg_, shape);
  return c;
}

KVCache CausalLM::make_paged_kv_cache(int64_t num_blocks, int64_t block_size) const {
  check_whole("make_paged_kv_cache");
  NXD_CHECK(num_blocks >= 1 && block_size >= 1, "[", type_name(),
            "::make_paged_kv_cache] need num_blocks >= 1 and block_size >= 1, got num_blocks=",
            num_blocks, " block_size=", block_size);
  KVCache c;
  c.max_batch = num_blocks;
  c.max_len = block_size;
  c.block_size = block_size;
  const Shape shape{num_blocks, cache_kv_heads(), block_size, cfg_.head_dim()};
  fill_kv(c, cfg_, shape);
  return c;
}

Tensor CausalLM::run_layers_cached(const Tensor& h, const CacheStep& step, KVCache& cache) {
  if (!decoder_stack_)
    throw InvalidArgument(str("[", type_name(),
                              "::forward_cached] this model family has no "
                              "KV-cache path (override run_layers_cached)"));
  return decoder_stack_->run_layers_cached(h, step, cache);
}

void CausalLM::check_cached(const Tensor& ids, const CacheStep& step, const KVCache& cache,
                            const char* op) const {
  check_whole(op);
  NXD_CHECK(!sequence_parallel_, "[", type_name(), "::", op,
            "] needs a model built without sequence ",
            "parallelism (sequence_parallel=false for inference)");
  NXD_CHECK_SHAPE(ids.dim() == 2 && (ids.dtype() == DType::i64 || ids.dtype() == DType::i32), "[",
                  type_name(), "::", op, "] ids must be i32/i64 [B,S], got ", ids.desc());
  NXD_CHECK((cache.block_size > 0) == step.block_tables.defined(), "[", type_name(), "::", op,
            "] a ", cache.block_size > 0 ? "paged" : "contiguous", " cache needs a CacheStep ",
            cache.block_size > 0 ? "with" : "without", " block_tables");
  NXD_CHECK_SHAPE((cache.block_size > 0 || ids.size(0) <= cache.max_batch) &&
                      static_cast<int64_t>(cache.k.size()) == cfg_.num_layers &&
                      cache.v.size() == cache.k.size(),
                  "[", type_name(), "::", op, "] ids ", ids.desc(), " do not fit the cache of ",
                  cache.max_batch, " rows and ", cache.k.size(), " layers (the model has ",
                  cfg_.num_layers, ")");
}

Tensor CausalLM::forward_cached(const Tensor& ids, const CacheStep& step, KVCache& cache) {
  check_cached(ids, step, cache, "forward_cached");
  NoGradGuard ng;
  const RootUnitScope root(*this, root_uses_);
  Tensor h = run_layers_cached(embed_tokens(ids), step, cache);
  return lm_head(final_norm(gather_last(h, step.lengths)));
}

Tensor CausalLM::forward_cached_all(const Tensor& ids, const CacheStep& step, KVCache& cache) {
  check_cached(ids, step, cache, "forward_cached_all");
  NoGradGuard ng;
  const RootUnitScope root(*this, root_uses_);
  return lm_head(final_norm(run_layers_cached(embed_tokens(ids), step, cache)));
}

int64_t sample_token(const std::vector<double>& logits, double temperature, int64_t top_k,
                     double u) {
  return sample_token(logits, temperature, top_k, 1.0, u);
}

int64_t sample_token(const std::vector<double>& logits, double temperature, int64_t top_k,
                     double top_p, double u) {
  return token_distribution(logits, temperature, top_k, top_p).draw(u);
}

double TokenDistribution::prob(int64_t id) const {
  for (size_t j = 0; j < ids.size(); ++j)
    if (ids[j] == id) return w[j] / z;
  return 0.0;
}

int64_t TokenDistribution::draw(double u) const {
  NXD_CHECK(!ids.empty(), "[TokenDistribution::draw] empty distribution");
  double target = u * z, c = 0;
  for (size_t j = 0; j < ids.size(); ++j) {
    c += w[j];
    if (target < c) return ids[j];
  }
  return ids.back();
}

TokenDistribution token_distribution(const std::vector<double>& logits, double temperature,
                                     int64_t top_k, double top_p) {
  const int64_t V = static_cast<int64_t>(logits.size());
  NXD_CHECK(V > 0, "[sample_token] empty logits");
  NXD_CHECK(temperature >= 0.0, "[sample_token] temperature must be >= 0, got ", temperature);
  NXD_CHECK(top_k >= 0, "[sample_token] top_k must be >= 0, got ", top_k);
  NXD_CHECK(top_p > 0.0 && top_p <= 1.0, "[sample_token] top_p must be in (0, 1], got ", top_p);
  TokenDistribution d;
  if (temperature == 0.0) {  // the first max
    d.ids = {std::max_element(logits.begin(), logits.end()) - logits.begin()};
    d.w = {1.0};
    d.z = 1.0;
    return d;
  }
  std::vector<int64_t>& idx = d.ids;
  idx.resize(V);
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t k = (top_k > 0 && top_k < V) ? top_k : V;
  auto better = [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (top_p < 1.0 || k < V) {
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
    idx.resize(k);
  }
  double mx = -INFINITY;
  for (int64_t i : idx) mx = std::max(mx, logits[i]);
  std::vector<double>& p = d.w;
  p.resize(idx.size());
  double z = 0;
  for (size_t j = 0; j < idx.size(); ++j) z += p[j] = std::exp((logits[idx[j]] - mx) / temperature);
  if (top_p < 1.0) {  // idx is in decreasing probability: keep the nucleus
    double c = 0;
    size_t keep = idx.size();
    for (size_t j = 0; j < idx.size(); ++j) {
      c += p[j] / z;
      if (c >= top_p) {
        keep = j + 1;
        break;
      }
    }
    idx.resize(keep), p.resize(keep);
    z = 0;
    for (double x : p) z += x;
  }
  d.z = z;
  return d;
}

void CausalLM::check_generate(const std::vector<std::vector<int64_t>>& prompts,
                              const GenerateOptions& opts) const {
  check_whole("generate");
  NXD_CHECK(!prompts.empty(), "[generate] no prompts");
  NXD_CHECK(opts.max_new_tokens >= 0, "[generate] max_new_tokens must be >= 0, got ",
            opts.max_new_tokens);
  NXD_CHECK(opts.temperature >= 0.0, "[generate] temperature must be >= 0, got ", opts.temperature);
  NXD_CHECK(opts.top_k >= 0, "[generate] top_k must be >= 0, got ", opts.top_k);
  NXD_CHECK(opts.top_p > 0.0 && opts.top_p <= 1.0, "[generate] top_p must be in (0, 1], got ",
            opts.top_p);
  for (size_t b = 0; b < prompts.size(); ++b) {
    NXD_CHECK(!prompts[b].empty(), "[generate] empty prompt ", b);
    NXD_CHECK(static_cast<int64_t>(prompts[b].size()) <= cfg_.max_position_embeddings,
              "[generate] prompt ", b, " has ", prompts[b].size(),
              " tokens, more than max_position_embeddings=", cfg_.max_position_embeddings);
    for (int64_t id : prompts[b])
      NXD_CHECK(id >= 0 && id < cfg_.vocab_size, "[generate] prompt id ", id,
                " outside the vocabulary [0, ", cfg_.vocab_size, ")");
  }
}

namespace {

struct EvalMode {  // eval mode for the call, the previous mode restored
  Module* m;
  bool was;
  explicit EvalMode(Module* mod) : m(mod), was(mod->is_training()) { m->eval(); }
  ~EvalMode() { m->train(was); }
};

using Row = GenerationRow;
using decode_detail::finish;
using decode_detail::modeled;
using decode_detail::wall;

}  // namespace

GenerateResult CausalLM::generate_batch(const std::vector<std::vector<int64_t>>& prompts,
                                        const GenerateOptions& opts) {
  check_generate(prompts, opts);
  NoGradGuard ng;
  const RootUnitScope root(*this, root_uses_);  // the root gathered once for the whole generation
  if (sequence_parallel_ || !supports_kv_cache()) return generate_recompute(prompts, opts);
  EvalMode mode(this);
  const int64_t B = static_cast<int64_t>(prompts.size()), max_pos = cfg_.max_position_embeddings;
  int64_t L = 1;  // the cache length the longest sequence reaches
  for (const auto& p : prompts)
    L = std::max(L, std::min(static_cast<int64_t>(p.size()) + opts.max_new_tokens, max_pos));
  KVCache cache;  // allocated by the first step (none when no row runs)
  return decode_loop(prompts, opts, {.max_pos = max_pos},
                     [&](const Tensor& ids, const CacheStep& step) {
                       if (cache.k.empty()) cache = make_kv_cache(B, L);
                       return forward_cached(ids, step, cache);
                     });
}

GenerateResult CausalLM::generate_recompute(const std::vector<std::vector<int64_t>>& prompts,
                                            const GenerateOptions& opts) {
  NoGradGuard ng;
  EvalMode mode(this);
  const int64_t max_pos = cfg_.max_position_embeddings;
  const RngStream stream{opts.seed, stream_id("nxd.generate")};
  GenerateResult res;
  std::vector<Row> rows(prompts.size());
  const double t0 = wall(), m0 = modeled();
  for (size_t b = 0; b < prompts.size(); ++b) {
    Row& r = rows[b];
    r.seq = prompts[b];
    res.prefill_tokens += static_cast<int64_t>(r.seq.size());
    if (opts.max_new_tokens == 0)
      r.stop = "max_new_tokens";
    else if (static_cast<int64_t>(r.seq.size()) >= max_pos)
      r.stop = "max_position_embeddings";
    while (r.stop.empty()) {
      const int64_t len = static_cast<int64_t>(r.seq.size());
      Tensor h = hidden_states(from_vector<int64_t>(r.seq, {1, len}));  // [1,len,d]
      advance_generation_row(r, lm_head(h.select(1, len - 1)).to_vector(), opts, stream, max_pos);
      ++res.decode_steps;
      res.decode_tokens += len;
    }
  }
  res.decode_seconds = wall() - t0;
  res.modeled_decode_seconds = modeled() - m0;
  return finish(rows, res);
}

std::vector<int64_t> CausalLM::generate(const std::vector<int64_t>& prompt,
                                        const GenerateOptions& opts) {
  NXD_CHECK(!prompt.empty(), "[generate] empty prompt");
  return generate_batch({prompt}, opts).sequences.at(0);
}

void advance_generation_row(GenerationRow& r, const std::vector<double>& logits,
                            const GenerateOptions& o, const RngStream& stream, int64_t max_pos) {
  const int64_t next = sample_token(logits, o.temperature, o.top_k, o.top_p,
                                    stream.uniform_f64(static_cast<uint64_t>(r.generated)));
  r.seq.push_back(next);
  ++r.generated;
  if (next == o.eos_token_id)
    r.stop = "eos";
  else if (r.generated >= o.max_new_tokens)
    r.stop = "max_new_tokens";
  else if (static_cast<int64_t>(r.seq.size()) >= max_pos)
    r.stop = "max_position_embeddings";
}

}  // namespace nxd

#include "nxd/layers/models/inference_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string_view>

#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/collective_cost.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/parallel/pad.h"

namespace nxd {

namespace {
int64_t round_up(int64_t n, int64_t m) {
  return (n + m - 1) / m * m;
}

// The elementwise kernels of a decoder layer (norms, residual adds, the gated activation, rotary,
// scaling): the Neuron compiler fuses them into their neighbours, so they are charged their Vector
// engine time rather than an HBM round trip each.
bool is_elementwise(std::string_view name) {
  return name == "add" || name == "mul" || name == "rms_norm_forward" || name == "swiglu_forward" ||
         name == "rotary_at_forward";
}

double arg_value(const std::string& args, std::string_view key) {
  const size_t at = args.find(key);
  return at == std::string::npos ? 0 : std::strtod(args.c_str() + at + key.size(), nullptr);
}

// What one step on rank 0's timeline within [w.first, w.second) pays beyond, or is charged
// instead of, its rooflines: each kernel kernel_seconds; each collective raised to
// collective_seconds; each elementwise kernel its Vector engine time (fused) instead of its
// roofline; each all-reduce of bf16 activations charged at 2 bytes an element (the sim's
// mappings reduce bf16 in f32, as NxD training does; the inference libraries reduce in the
// activations' dtype).
StepCharges step_charges(const std::vector<sim::TraceEvent>& events, std::pair<double, double> w,
                         const InferenceOverheads& o, const sim::MachineSpec& m, double hz,
                         bool bf16, int tp) {
  StepCharges c;
  const double eps = 1e-12;
  std::vector<int> ranks(tp);
  for (int r = 0; r < tp; ++r) ranks[r] = r;
  for (const auto& ev : events) {
    if (ev.start < w.first - eps || ev.start >= w.second - eps) continue;
    const std::string_view cat(ev.category);
    if (cat == "compute") {
      ++c.kernels;
      c.fixed_seconds += o.kernel_seconds;
      if (o.fuse_elementwise && is_elementwise(ev.name))
        c.fused_seconds += arg_value(ev.args, "flops=") / (o.vector_lanes * hz) - ev.duration;
    } else if (cat == "comm") {
      double seconds = ev.duration;
      if (bf16 && ev.name == "all_reduce" && tp > 1) {
        const double bytes = arg_value(ev.args, "bytes=") / 2;
        seconds = sim::collective_cost(m, sim::CollKind::all_reduce, ranks, bytes).seconds;
        c.collective_dtype_seconds += seconds - ev.duration;
      }
      ++c.collectives;
      c.fixed_seconds += std::max(0.0, o.collective_seconds - seconds);
    }
  }
  return c;
}
// The Vector engine's clock (NKI architecture guides: NeuronCore-v2 1.12 GHz, Trainium2 0.96
// GHz, Trainium3 1.2 GHz); a logical core of LNC physical cores runs LNC engines.
double vector_engine_hz(const sim::MachineSpec& m) {
  if (m.core.name.rfind("NeuronCore-v3", 0) == 0)
    return 0.96e9 * std::max(1.0, m.core.bf16_flops / 79e12);
  if (m.core.name.rfind("NeuronCore-v4", 0) == 0)
    return 1.2e9 * std::max(1.0, m.core.bf16_flops / 79e12);
  return 1.12e9;
}

// The SBUF of a rank (NKI architecture guides: NeuronCore-v2 24 MiB, NeuronCore-v3 28 MiB,
// NeuronCore-v4 32 MiB; a logical core of LNC physical cores has LNC of them).
double sbuf_bytes(const sim::MachineSpec& m) {
  if (m.core.name.rfind("NeuronCore-v3", 0) == 0)
    return 28.0 * (1 << 20) * std::max(1.0, m.core.bf16_flops / 79e12);
  if (m.core.name.rfind("NeuronCore-v4", 0) == 0)
    return 32.0 * (1 << 20) * std::max(1.0, m.core.bf16_flops / 79e12);
  return 24.0 * (1 << 20);
}

// What the prefill's attention costs beyond the causal kernel the sim charges when it is built as
// transformers-neuronx builds it (PrefillAttention::materialized): the masked half of the score
// products (every position is computed, then masked), and, when a layer's bf16 score matrix does
// not fit the SBUF, its trips through HBM.
double materialized_attention_seconds(const std::vector<sim::TraceEvent>& events,
                                      std::pair<double, double> w, const ModelConfig& cfg,
                                      const InferenceModelOptions& o, int64_t S,
                                      const sim::MachineSpec& m) {
  double seconds = 0;
  for (const auto& ev : events)
    if (ev.start >= w.first - 1e-12 && ev.start < w.second - 1e-12 && ev.name == "cached_attention")
      seconds += arg_value(ev.args, "flops=") / m.core.bf16_flops;
  const double scores = static_cast<double>(o.batch) *
                        static_cast<double>(cfg.num_attention_heads / o.tp) *
                        static_cast<double>(S) * static_cast<double>(S);
  if (scores * 2 > sbuf_bytes(m))
    seconds += static_cast<double>(cfg.num_layers) * scores * o.overheads.score_bytes_through_hbm /
               m.core.hbm_bandwidth;
  return seconds;
}

// The softmax of every score row of one step: rows sit one per SBUF partition (128), each pass
// reads a row's `cols` scores at one element per cycle.
double softmax_seconds(const ModelConfig& cfg, int tp, int64_t rows_per_head, double cols,
                       int passes, double hz) {
  const int64_t heads = cfg.num_attention_heads / tp;
  const double tiles = std::ceil(static_cast<double>(heads * rows_per_head) / 128.0);
  return static_cast<double>(cfg.num_layers) * passes * tiles * cols / hz;
}

}  // namespace

bool InferencePadding::needed() const {
  return padded_heads != heads || padded_kv_heads != kv_heads || kv_replicas > 1 ||
         padded_ffn != ffn || padded_vocab != vocab;
}

std::string InferencePadding::describe() const {
  auto arrow = [](int64_t a, int64_t b) { return a == b ? str(a) : str(a, " -> ", b); };
  std::string kv = arrow(kv_heads, padded_kv_heads);
  if (kv_replicas > 1)
    kv += str(" replicated x", kv_replicas, " (", padded_kv_heads * kv_replicas, ")");
  return str("attention heads ", arrow(heads, padded_heads), ", KV heads ", kv, ", FFN ",
             arrow(ffn, padded_ffn), ", vocabulary ", arrow(vocab, padded_vocab));
}

InferencePadding pad_for_inference(const ModelConfig& cfg, int tp) {
  NXD_CHECK_T(ConfigError, tp >= 1, "[pad_for_inference] tp must be >= 1, got ", tp);
  InferencePadding p;
  p.heads = cfg.num_attention_heads, p.kv_heads = cfg.kv_heads();
  p.ffn = cfg.ffn_size(), p.vocab = cfg.vocab_size;
  HeadPadding h;
  p.padded = pad_model_config(cfg, tp, &h);
  p.padded_heads = h.padded_heads, p.padded_kv_heads = h.padded_kv_heads;
  p.kv_replicas = std::max<int64_t>(1, tp / h.padded_kv_heads);
  p.padded.kv_size_multiplier = p.kv_replicas;
  p.padded_ffn = round_up(p.ffn, tp), p.padded_vocab = round_up(p.vocab, tp);
  p.padded.ffn_hidden_size = p.padded_ffn;
  p.padded.vocab_size = p.padded_vocab;
  return p;
}

std::vector<int64_t> context_buckets(int64_t max_context_tokens) {
  NXD_CHECK_T(ConfigError, max_context_tokens >= 1,
              "[context_buckets] max_context_tokens must be >= 1, got ", max_context_tokens);
  std::vector<int64_t> b;
  const int top = static_cast<int>(std::lround(std::log2(static_cast<double>(max_context_tokens))));
  for (int i = 7; i < top; ++i) b.push_back(int64_t{1} << i);
  b.push_back(max_context_tokens);
  return b;
}

int64_t context_bucket(int64_t prompt_tokens, int64_t max_context_tokens) {
  NXD_CHECK_T(ConfigError, prompt_tokens >= 1 && max_context_tokens >= prompt_tokens,
              "[context_bucket] need 1 <= prompt_tokens <= max_context_tokens, got ", prompt_tokens,
              " and ", max_context_tokens);
  for (int64_t b : context_buckets(max_context_tokens))
    if (b >= prompt_tokens) return b;
  return max_context_tokens;
}

InferenceEstimate estimate_inference(ModelConfig cfg, const InferenceModelOptions& o) {
  NXD_CHECK_T(ConfigError, o.tp >= 1 && o.batch >= 1 && o.prompt_tokens >= 1 && o.new_tokens >= 1,
              "[estimate_inference] need tp, batch, prompt_tokens, new_tokens >= 1, got tp=", o.tp,
              " batch=", o.batch, " prompt=", o.prompt_tokens, " new=", o.new_tokens);
  NXD_CHECK_T(ConfigError, o.hbm_efficiency > 0 && o.hbm_efficiency <= 1,
              "[estimate_inference] hbm_efficiency must be in (0, 1], got ", o.hbm_efficiency);
  const int64_t L = o.prompt_tokens + o.new_tokens;
  NXD_CHECK_T(ConfigError, o.max_context_tokens == 0 || o.max_context_tokens >= o.prompt_tokens,
              "[estimate_inference] max_context_tokens=", o.max_context_tokens,
              " is below prompt_tokens=", o.prompt_tokens);
  // the context-encoding graph runs at its bucket: the prompt padded to it
  const int64_t S =
      o.context_buckets
          ? context_bucket(o.prompt_tokens, o.max_context_tokens > 0 ? o.max_context_tokens : L)
          : o.prompt_tokens;
  const InferencePadding padding = pad_for_inference(cfg, o.tp);
  cfg = padding.padded;
  cfg.device = Device::meta;
  cfg.sequence_parallel = false;
  cfg.max_position_embeddings = std::max(cfg.max_position_embeddings, L);
  sim::LaunchOptions lo;
  lo.world_size = o.tp;
  sim::MachineSpec m = sim::machine(o.instance);
  NXD_CHECK_T(ConfigError, o.tp <= m.world_size(), "[estimate_inference] tp=", o.tp,
              " exceeds the ", m.world_size(), " NeuronCores of ", m.name);
  m.core.hbm_bandwidth *= o.hbm_efficiency;
  lo.machine = m;
  lo.memory_capacity = 0;     // a model over HBM is still estimated; callers compare the bytes
  lo.record_timeline = true;  // the kernels and collectives of each step are counted from it
  InferenceEstimate e;
  e.machine = m.name;
  e.padding = padding;
  std::mutex mu;
  std::pair<double, double> window[2];
  const sim::LaunchResult run = sim::launch(lo, [&] {
    parallel_state::initialize_model_parallel(o.tp);
    auto model = make_causal_lm(cfg, 0);
    int64_t weights = 0;
    for (const auto& [n, t] : model->named_parameters()) weights += t.nbytes();
    KVCache cache = model->make_kv_cache(o.batch, L);
    std::vector<int64_t> rows(o.batch), zero(o.batch, 0), P(o.batch, o.prompt_tokens),
        PS(o.batch, S), one(o.batch, 1);
    for (int64_t b = 0; b < o.batch; ++b) rows[b] = b;
    sim::SimClock* clock = sim::current_sim_clock();
    const double p0 = clock->now();
    double t0 = p0;
    model->forward_cached(empty({o.batch, S}, DType::i64, Device::meta),
                          make_cache_step(rows, zero, PS, Device::meta), cache);
    const double ttft = clock->now() - t0;
    // every decode step attends the whole cache (kernels/kv_cache.h): they cost the same
    t0 = clock->now();
    model->forward_cached(empty({o.batch, 1}, DType::i64, Device::meta),
                          make_cache_step(rows, P, one, Device::meta), cache);
    const double tpot = clock->now() - t0;
    std::lock_guard g(mu);
    if (parallel_state::get_tensor_model_parallel_rank() == 0) {
      e.ttft = ttft, e.tpot = tpot, e.weight_bytes = weights, e.kv_bytes = cache.nbytes();
      window[0] = {p0, p0 + ttft}, window[1] = {t0, t0 + tpot};
    }
  });
  const auto& events = run.timeline->events(0);
  const double hz = vector_engine_hz(m);
  const bool bf16 = cfg.dtype == DType::bf16;
  StepCharges prefill = step_charges(events, window[0], o.overheads, m, hz, bf16, o.tp);
  StepCharges decode = step_charges(events, window[1], o.overheads, m, hz, bf16, o.tp);
  e.context_tokens = S;
  const int passes = o.overheads.softmax_passes;
  // prefill: batch x prompt rows, each over half the prompt on average (causal) or, materialized,
  // over every position (masked after the products)
  const bool materialized = o.prefill_attention == PrefillAttention::materialized;
  prefill.softmax_seconds = softmax_seconds(
      cfg, o.tp, o.batch * S, (materialized ? 1.0 : 0.5) * static_cast<double>(S), passes, hz);
  if (materialized)
    prefill.attention_seconds = materialized_attention_seconds(events, window[0], cfg, o, S, m);
  // decode: batch rows over the whole cache (as the attention is charged)
  decode.softmax_seconds = softmax_seconds(cfg, o.tp, o.batch, static_cast<double>(L), passes, hz);
  e.prefill = prefill, e.decode = decode;
  e.ttft += prefill.softmax_seconds + prefill.attention_seconds;
  e.tpot += decode.softmax_seconds;
  // on-device sampling: one kernel reading the batch's gathered f32 logits
  e.sampling_seconds = o.overheads.kernel_seconds +
                       static_cast<double>(o.batch * cfg.vocab_size * 4) / m.core.hbm_bandwidth;
  e.ttft += prefill.fixed_seconds + prefill.fused_seconds + prefill.collective_dtype_seconds +
            e.sampling_seconds;
  e.tpot += decode.fixed_seconds + decode.fused_seconds + decode.collective_dtype_seconds +
            e.sampling_seconds;
  e.e2e_per_token = (e.ttft + (o.new_tokens - 1) * e.tpot) / o.new_tokens;
  e.output_tokens_per_s = static_cast<double>(o.batch) / e.e2e_per_token;
  return e;
}

}  // namespace nxd

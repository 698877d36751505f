#include "nxd/layers/models/inference_model.h"

#include <algorithm>
#include <mutex>

#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/models/causal_lm.h"

namespace nxd {

InferenceEstimate estimate_inference(ModelConfig cfg, const InferenceModelOptions& o) {
  NXD_CHECK_T(ConfigError, o.tp >= 1 && o.batch >= 1 && o.prompt_tokens >= 1 && o.new_tokens >= 1,
              "[estimate_inference] need tp, batch, prompt_tokens, new_tokens >= 1, got tp=", o.tp,
              " batch=", o.batch, " prompt=", o.prompt_tokens, " new=", o.new_tokens);
  NXD_CHECK_T(ConfigError, o.hbm_efficiency > 0 && o.hbm_efficiency <= 1,
              "[estimate_inference] hbm_efficiency must be in (0, 1], got ", o.hbm_efficiency);
  const int64_t L = o.prompt_tokens + o.new_tokens;
  cfg.device = Device::meta;
  cfg.sequence_parallel = false;
  cfg.kv_size_multiplier = std::max<int64_t>(1, o.tp / cfg.kv_heads());
  cfg.max_position_embeddings = std::max(cfg.max_position_embeddings, L);
  sim::LaunchOptions lo;
  lo.world_size = o.tp;
  sim::MachineSpec m = sim::machine(o.instance);
  NXD_CHECK_T(ConfigError, o.tp <= m.world_size(), "[estimate_inference] tp=", o.tp,
              " exceeds the ", m.world_size(), " NeuronCores of ", m.name);
  m.core.hbm_bandwidth *= o.hbm_efficiency;
  lo.machine = m;
  InferenceEstimate e;
  e.machine = m.name;
  std::mutex mu;
  sim::launch(lo, [&] {
    parallel_state::initialize_model_parallel(o.tp);
    auto model = make_causal_lm(cfg, 0);
    int64_t weights = 0;
    for (const auto& [n, t] : model->named_parameters()) weights += t.nbytes();
    KVCache cache = model->make_kv_cache(o.batch, L);
    std::vector<int64_t> rows(o.batch), zero(o.batch, 0), P(o.batch, o.prompt_tokens),
        one(o.batch, 1);
    for (int64_t b = 0; b < o.batch; ++b) rows[b] = b;
    sim::SimClock* clock = sim::current_sim_clock();
    double t0 = clock->now();
    model->forward_cached(empty({o.batch, o.prompt_tokens}, DType::i64, Device::meta),
                          make_cache_step(rows, zero, P, Device::meta), cache);
    const double ttft = clock->now() - t0;
    // every decode step attends the whole cache (kernels/kv_cache.h): they cost the same
    t0 = clock->now();
    model->forward_cached(empty({o.batch, 1}, DType::i64, Device::meta),
                          make_cache_step(rows, P, one, Device::meta), cache);
    const double tpot = clock->now() - t0;
    std::lock_guard g(mu);
    if (parallel_state::get_tensor_model_parallel_rank() == 0) {
      e.ttft = ttft, e.tpot = tpot, e.weight_bytes = weights, e.kv_bytes = cache.nbytes();
    }
  });
  e.e2e_per_token = (e.ttft + (o.new_tokens - 1) * e.tpot) / o.new_tokens;
  return e;
}

}  // namespace nxd

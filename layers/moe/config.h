#pragma once
// MoeConfig: the mixture-of-experts part of a model config (NxD Training's model.moe keys).
// num_experts == 0 is a dense model (every other field ignored).
#include <cstdint>

namespace nxd {

struct MoeConfig {
  int64_t num_experts = 0;  // E; 0 = dense
  int64_t top_k = 2;        // experts per token (k <= E)
  // Every how many decoder layers the MLP is a MoE layer: layer l is MoE when l % frequency == 0
  // (1: every layer, Mixtral).
  int64_t frequency = 1;
  // Without dropless: each expert takes at most ceil(capacity_factor * T * k / E) of the T local
  // tokens' k*T assignments (first come in token order); the rest are dropped (their slot adds
  // nothing: the token keeps its residual only) and counted.
  double capacity_factor = 1.0;
  bool dropless = true;
  // Load-balancing loss (Switch Transformer / NxD form): coef * E/k * sum_e f_e P_e, f_e = tokens
  // routed to e (before drops) / T, P_e = mean router probability of e. 1 * coef when balanced.
  double router_aux_loss_coef = 0.02;
  // Router z-loss (ST-MoE): coef * mean over tokens of logsumexp(router logits)^2; 0 = off.
  double router_z_loss_coef = 0.0;
  // Renormalize the k selected probabilities to sum to 1 (Mixtral) instead of using them as is.
  bool normalize_top_k_affinities = true;

  bool enabled() const { return num_experts > 0; }
  bool is_moe_layer(int64_t layer) const {
    return enabled() && frequency > 0 && layer % frequency == 0;
  }
  // Throws ConfigError naming the values: top_k in [1, E], frequency >= 1, capacity_factor > 0,
  // coefficients >= 0 (nothing to check when disabled).
  void validate() const;
  // Throws ConfigError unless E is divisible by the expert-parallel size `ep`.
  void validate_parallel(int ep) const;
};

}  // namespace nxd

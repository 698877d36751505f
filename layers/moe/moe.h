#pragma once
// Mixture-of-experts MLP (Mixtral's block_sparse_moe; NxD's MoE with RouterTopK and ExpertMLPs).
//
//   x [B,S,H] -> tokens X [T,H] (T = B*S)
//   logits = X Wg^T  (gate.weight [E,H]),  p = softmax(logits)        [T,E]
//   (v, e) = topk(p, k); v /= sum(v) when normalize_top_k_affinities     [T,k]
//   y_t = sum_j v_tj * Expert_{e_tj}(x_t),  Expert(x) = w2 (silu(w1 x) * (w3 x))  (SwiGLU)
//
// Experts run batched: the assignments (t, j) are ordered by expert (tokens in order within an
// expert), the routed rows gathered (one gather), each expert's rows go through its three GEMMs,
// and the weighted outputs are scatter-added back onto their tokens (one scatter-add).
// Capacity (without dropless): expert e keeps its first ceil(capacity_factor*T*k/E) assignments
// in token order; the others are dropped (the token's slot contributes nothing) and counted.
// Auxiliary losses (config.h): the load-balancing loss and the optional router z-loss, weighted by
// their coefficients. Their gradient is injected in backward (Megatron's MoEAuxLossAutoScaler):
// the layer's output goes through an identity whose backward also seeds d(aux) with the
// MoeAuxLossScale in force at the forward (1 by default; the factor the training loss is scaled
// by before backward, e.g. 1/microbatches), so a recomputed layer (full activation checkpointing)
// and a pipeline stage without the loss train the router alike. aux_loss() is the value
// (detached) for the model's reported loss and the logs; stats() has the step's counts.
//
// Expert parallelism (ep_group of P members, P divides E): member r holds experts
// [r*E/P, (r+1)*E/P) under their global names (experts.<e>.w1 ...). Every member routes its own
// tokens; the rows for each member's experts are exchanged with all_to_all_rows (per-expert counts
// first), computed by their expert, and sent back the same way. The experts' weights get their
// gradient scaled by 1/P in backward, so averaging them over the expert-data-parallel group (not
// the whole DP group) gives the global DP mean; the router's over the whole DP group as usual.
#include <cstdint>
#include <memory>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/layers/basic.h"
#include "nxd/layers/init_scheme.h"
#include "nxd/layers/moe/config.h"

namespace nxd {

struct MoeMlpOptions {
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;  // each expert's intermediate size
  MoeConfig moe;
  InitScheme init;
  ParamOptions param;
  // The expert-parallel group (null or one member: every expert local).
  std::shared_ptr<Communicator> ep_group;
};

// One step's routing figures of one MoE layer (this rank's tokens).
struct MoeStats {
  int64_t tokens = 0;                // T
  int64_t assignments = 0;           // T * k
  int64_t dropped = 0;               // assignments dropped by the capacity
  double aux_loss = 0;               // load-balancing loss, before its coefficient
  double z_loss = 0;                 // router z-loss, before its coefficient
  std::vector<int64_t> expert_load;  // assignments routed to each expert (before drops) [E]
};

// An expert's SwiGLU MLP with Mixtral's names: w1 (gate) [I,H], w3 (up) [I,H], w2 (down) [H,I].
class MixtralExpert : public Module {
 public:
  MixtralExpert(int64_t hidden_size, int64_t ffn_hidden_size, const LinearOptions& in,
                const LinearOptions& out);
  // x [M,H] -> [M,H]; the weights' gradients scaled by grad_scale.
  Tensor forward(const Tensor& x, double grad_scale = 1.0) const;

 private:
  std::shared_ptr<Linear> w1_, w2_, w3_;
};

class MoeMlp : public Module {
 public:
  explicit MoeMlp(const MoeMlpOptions& opts);
  // x [B,S,H] (or [T,H]) -> the same shape. Keeps aux_loss() and stats() of this call.
  Tensor forward(const Tensor& x) const;
  // coef * load-balancing + z_coef * z-loss of the last forward (a detached scalar: its gradient
  // is injected through the output's backward; undefined before the first forward).
  const Tensor& aux_loss() const { return aux_; }
  const MoeStats& stats() const { return stats_; }
  int64_t num_experts() const { return cfg_.num_experts; }
  int64_t first_local_expert() const { return first_; }
  int64_t num_local_experts() const { return local_; }
  int ep_size() const { return ep_ ? ep_->size() : 1; }

 private:
  struct Routing;
  Routing route(const Tensor& probs, const Tensor& topk_idx) const;
  Tensor run_experts(const Tensor& rows, const std::vector<int64_t>& per_expert) const;
  Tensor run_parallel(const Tensor& rows, const Routing& r) const;
  MoeConfig cfg_;
  int64_t hidden_;
  int64_t first_ = 0, local_ = 0;
  std::shared_ptr<Communicator> ep_;
  std::shared_ptr<Linear> gate_;
  std::shared_ptr<ModuleList> experts_;
  mutable Tensor aux_;
  mutable MoeStats stats_;
};

// The scale of the auxiliary losses' injected gradient while it lives (restores the previous one):
// wrap the forward and backward of a loss that is multiplied by `scale` before backward (gradient
// accumulation, a pipeline's microbatches), recomputation included.
class MoeAuxLossScale {
 public:
  explicit MoeAuxLossScale(double scale);
  ~MoeAuxLossScale();
  MoeAuxLossScale(const MoeAuxLossScale&) = delete;
  MoeAuxLossScale& operator=(const MoeAuxLossScale&) = delete;
  struct Slot {
    double scale = 1.0;
  };

 private:
  double prev_;
};
double moe_aux_loss_grad_scale();

// The expert-parallel group models build their MoE layers over: the parallel_state EP group, or
// null (every expert local) when parallel_state is not initialized or EP is 1.
std::shared_ptr<Communicator> moe_expert_parallel_group();

// The experts' weights of every MoE layer under root (distinct on each expert-parallel rank: their
// gradients are averaged over the expert-data-parallel group and their norm summed over EP).
std::vector<Tensor> moe_expert_parameters(Module& root);

// The MoE layers of a model (each MoeMlp under root, in named_modules() order).
std::vector<const MoeMlp*> moe_layers(Module& root);

}  // namespace nxd

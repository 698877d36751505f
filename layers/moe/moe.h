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
// TrainingLossScale (layers/step_hooks.h) in force at the forward (1 by default; the factor the
// training loss is scaled by before backward, e.g. 1/microbatches), so a recomputed layer (full
// activation checkpointing) and a pipeline stage without the loss train the router alike.
// aux_loss() is the value (detached) for the model's reported loss and the logs; stats() has the
// step's counts.
//
// Context parallelism (cp_group of C members, each holding its chunks of the sequences): the
// experts run on the local tokens unchanged; the auxiliary losses are one rank's over the whole
// sequence: the per-expert loads and the token count are summed over CP (raw all-reduce), each
// member's loss is its tokens' part (sum of its router probabilities / the global count), its
// injected gradient scaled by C (as the CP loss's: the gradients are averaged over DP x CP), and
// the reported value is the sum over CP. Capacity drops depend on the whole sequence's token order,
// hence dropless only. With expert parallelism each CP rank dispatches its own tokens over its EP
// group like a DP rank (parallel_state folds EP and expert-DP over the data x context ranks, so
// the EP group may hold CP peers); the experts' gradients are then averaged over expert-DP, which
// spans CP (see below).
//
// Expert parallelism (ep_group of P members, P divides E): member r holds experts
// [r*E/P, (r+1)*E/P) under their global names (experts.<e>.w1 ...). Every member routes its own
// tokens; the rows for each member's experts are exchanged with all_to_all_rows (every member's
// per-expert counts all-gathered first, once per layer: they give the four exchanges' padding),
// computed by their expert, and sent back the same way. The experts' weights get their
// gradient scaled by 1/P in backward, so averaging them over the expert-data-parallel group (not
// the whole DP group) gives the global DP mean; the router's over the whole DP group as usual.
// With context parallelism both are over DP x CP: EP x expert-DP tiles the data x context group
// (parallel_state.h), so the mean over expert-DP (DP x CP / P ranks) of 1/P x the sum over an EP
// group of its members' (CP-scaled) token gradients is the DP x CP mean the dense weights get.
//
// ZeRO-3 (optim/zero1.h): at EP > 1 the experts' module is a unit of its own, sharded over
// expert-DP by the experts' optimizer; the experts run through run_param_unit (layers/param_unit.h)
// between the dispatch and combine exchanges, so their weights are gathered around their GEMMs
// only.
//
// Tensor parallelism inside each expert (tp_group of Q members; NxD's ExpertMLPs): every expert's
// intermediate dimension is split over TP, w1/w3 by rows (partition_dim 0, as a column-parallel
// layer) and w2 by columns (partition_dim 1, row-parallel), under their global names; the router
// is replicated. Every TP rank routes the same tokens (the EP group is the ranks of one TP rank),
// computes its shard of every expert and combines its partial outputs with the affinities; the
// combined [T,H] output is then summed over TP once for the whole layer (all-reduce; under
// sequence parallelism a reduce-scatter along the sequence), not once per expert. Backward: the
// experts' input gradient (partial per TP rank) is all-reduced over TP (copy_to on the routed
// path only: the router's gradient is the same on every TP rank) and so are the affinities'
// gradients ([T,k], each rank's is the part of its shard).
// Sequence parallelism (sequence_parallel with Q > 1): the input is this rank's sequence shard;
// the layer all-gathers it over TP first (backward: reduce-scatter), routes the whole sequence on
// every TP rank (so routing, capacity and the auxiliary losses are one rank's), and
// reduce-scatters the combined output back. The router's input gradient is scaled by 1/Q on each
// rank before that reduce-scatter sums the Q identical copies.
#include <cstdint>
#include <memory>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/layers/basic.h"
#include "nxd/layers/init_scheme.h"
#include "nxd/layers/moe/config.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/step_hooks.h"

namespace nxd {

struct MoeMlpOptions {
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;  // each expert's intermediate size
  MoeConfig moe;
  InitScheme init;
  ParamOptions param;
  // The expert-parallel group (null or one member: every expert local).
  std::shared_ptr<Communicator> ep_group;
  // The tensor-parallel group the experts' intermediate dimension is split over (null or one
  // member: whole experts).
  std::shared_ptr<Communicator> tp_group;
  // The input is this rank's shard of sequence_dimension (needs tp_group with > 1 member).
  bool sequence_parallel = false;
  int64_t sequence_dimension = 1;
  // The context-parallel group (null or one member: the whole sequence is here). Needs dropless
  // (ConfigError otherwise).
  std::shared_ptr<Communicator> cp_group;
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

// An expert's SwiGLU MLP with Mixtral's names: w1 (gate) [I,H], w3 (up) [I,H], w2 (down) [H,I],
// each a TP shard over `tp_group` (w1/w3 [I/Q,H] as column-parallel layers, w2 [H,I/Q]
// row-parallel; initialized as the slices of the whole weights, tagged for the checkpoints and the
// gradient norm). Only the layers' weights are used: no collective per expert.
class MixtralExpert : public Module {
 public:
  struct Options {
    int64_t hidden_size = 0, ffn_hidden_size = 0;
    ParamInit in_init, out_init;  // w1/w3's and w2's
    ParamOptions param;
    std::shared_ptr<Communicator> tp_group;  // must have at least one member
  };
  explicit MixtralExpert(const Options& opts);
  // x [M,H] -> this TP rank's partial output [M,H] (the whole output at TP 1); the weights'
  // gradients scaled by grad_scale.
  Tensor forward(const Tensor& x, double grad_scale = 1.0) const;

 private:
  std::shared_ptr<ColumnParallelLinear> w1_, w3_;
  std::shared_ptr<RowParallelLinear> w2_;
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
  int tp_size() const { return tp_->size(); }

 private:
  struct Routing;
  Routing route(const Tensor& probs, const Tensor& topk_idx) const;
  Tensor run_experts(const Tensor& rows, const std::vector<int64_t>& per_expert) const;
  Tensor run_parallel(const Tensor& rows, const Routing& r) const;
  // The weighted auxiliary losses of this rank's tokens (sets stats_; see above for CP).
  Tensor aux_losses(const Tensor& logits, const Tensor& probs, const Routing& r, int64_t T) const;
  MoeConfig cfg_;
  int64_t hidden_;
  int64_t first_ = 0, local_ = 0;
  std::shared_ptr<Communicator> ep_;
  std::shared_ptr<Communicator> tp_;  // one member without TP
  std::shared_ptr<Communicator> cp_;  // null without CP
  bool sp_ = false;
  int64_t seq_dim_ = 1;
  std::shared_ptr<Linear> gate_;
  std::shared_ptr<ModuleList> experts_;
  mutable Tensor aux_;
  mutable MoeStats stats_;
};

// The expert-parallel group models build their MoE layers over: the parallel_state EP group, or
// null (every expert local) when parallel_state is not initialized or EP is 1.
std::shared_ptr<Communicator> moe_expert_parallel_group();

// The tensor-parallel group models build their MoE layers' experts over: the parallel_state TP
// group, or null (whole experts) when parallel_state is not initialized or TP is 1.
std::shared_ptr<Communicator> moe_tensor_parallel_group();

// The experts' weights of every MoE layer under root (distinct on each expert-parallel rank: their
// gradients are averaged over the expert-data-parallel group and their norm summed over EP).
std::vector<Tensor> moe_expert_parameters(Module& root);

// Each MoE layer's `experts` module under root (named_modules() order): ZeRO-3's expert units
// under expert parallelism (optim::Zero1Options::expert_units; MoeMlp runs them through
// run_param_unit).
std::vector<Module*> moe_expert_modules(Module& root);

// The MoE layers of a model (each MoeMlp under root, in named_modules() order).
std::vector<const MoeMlp*> moe_layers(Module& root);

// The MoE layers' figures of their last forward under root, added to `out` (a model with MoE
// layers reports them from Module::step_metrics): "moe_aux_loss" (the weighted auxiliary losses)
// and "moe_tokens_dropped" (assignments over capacity), summed over layers, and
// "moe_expert_load_min" and "moe_expert_load_max", the fewest and most assignments routed to one
// expert. All four are reported even where root holds no MoE layer (a pipeline stage).
void add_moe_step_metrics(Module& root, StepMetrics& out);

}  // namespace nxd

#pragma once
// The global gradient norm of a model distributed over tensor-parallel (TP), pipeline-parallel
// (PP) and ZeRO-1 sharding groups, counting every logical parameter exactly once, and clipping by
// it (NxD parallel_layers/grads.py: get_grad_norm / clip_grad_norm; docs/NXD_INTERNALS.md).
//
// What each rank adds for one gradient g (norm_type 2: the sum of squares; inf: max |g|):
//   - TP-sharded (attrs.tensor_model_parallel, kv_replicas == 1): every rank holds a distinct
//     shard: all of it.
//   - GQA K/V replicated by kv_size_multiplier m (kv_replicas == m > 1): m TP ranks hold the same
//     shard with bitwise-identical gradients (the layer computes them from dK/dV summed over the
//     KV-replica group): 1/m of its sum of squares on each of them (all of its max). NxD counts
//     them m times; nxd counts them once. Weighting rather than electing one replica keeps this
//     independent of which ranks form a KV-replica group (a layout detail of the QKV layer).
//   - Not TP-sharded (norm weights, row-parallel biases, every parameter of a plain module):
//     duplicated on every TP rank: counted on TP rank 0 only (NxD's force_spmd=False rule), not
//     NxD's default "every rank adds it and the sum is divided by tp". Both give the same value
//     when the copies agree; counting once is exact (no rounding from the division) and does not
//     depend on the copies agreeing. They agree only after allreduce_sequence_parallel_gradients
//     under sequence parallelism: call GradSync::finish(), then that, then the norm.
//   - `shared` (a tied weight whose other copy is counted elsewhere, e.g. the embedding on the
//     last PP stage): not counted; it is still clipped. A weight tied within one module tree is a
//     single tensor and is listed once by norm_params().
// The per-rank values are then summed (max for inf) over TP, then PP, then the ZeRO-1 sharding
// group (whose members hold disjoint shards of the already-averaged gradients). There is no
// reduction over DP: after the DP averaging the gradients are identical across DP.
// Accumulation is in double (bf16 and f32 gradients are read exactly); reductions are all-reduces
// of one f64 value with the backends' fixed order, so every rank gets the bitwise-same norm.
//
// Parameters without a .grad (and meta gradients) are skipped, like torch.
#include <memory>
#include <string>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/optim/optimizer.h"

namespace nxd::optim {

struct NormParam {
  std::string name;
  Tensor param;  // its .grad() is read (and scaled by clipping)
  ParallelAttrs attrs;
  bool shared = false;  // counted elsewhere: left out of the norm, still clipped
  // A mixture-of-experts expert weight: each expert-parallel rank holds different experts, so
  // their sum of squares is summed over NormGroups::ep (the rest is identical across EP).
  bool expert = false;
};

// Every parameter of `root` with its parallel attributes (parallel_parameters order, each tensor
// once); the MoE experts' weights marked expert.
std::vector<NormParam> norm_params(Module& root);

// The groups the norm is reduced over; a null group is a group of one rank.
struct NormGroups {
  std::shared_ptr<Communicator> tp;     // decides duplicated/sharded counting
  std::shared_ptr<Communicator> pp;     // stages hold different parameters
  std::shared_ptr<Communicator> zero1;  // ZeRO-1 sharding group (disjoint gradient shards)
  std::shared_ptr<Communicator> ep;     // expert-parallel group (expert parameters' sums)
  // TP, PP and (EP > 1) EP groups of parallel_state (no ZeRO-1 group).
  static NormGroups from_parallel_state();
};

// The global norm (norm_type 2 or kInfNorm). Collective over every group given.
double parallel_grad_norm(const std::vector<NormParam>& params, const NormGroups& groups,
                          double norm_type = 2.0);
// Scales every gradient (shared ones too) by max_norm / (total_norm + 1e-6) when that is < 1.
void clip_grads_with_norm(const std::vector<NormParam>& params, double max_norm, double total_norm);
// parallel_grad_norm then clip_grads_with_norm; returns the norm before clipping (what
// metrics.csv reports). A non-finite norm is returned as is and nothing is scaled.
double clip_parallel_grad_norm(const std::vector<NormParam>& params, double max_norm,
                               const NormGroups& groups, double norm_type = 2.0);
// The same for a module under parallel_state's groups.
double clip_parallel_grad_norm(Module& model, double max_norm, double norm_type = 2.0);

}  // namespace nxd::optim

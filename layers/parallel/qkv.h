#pragma once
// GQAQKVColumnParallelLinear (NxD modules/qkv_linear.py): the Q, K and V projections of
// grouped-query attention as column-parallel layers, with K/V heads replicated
// kv_size_multiplier (m) times so that the TP degree may exceed the number of KV heads.
//
// Parameters: three children named like the plain attention's projections, q_proj, k_proj,
// v_proj, each with "weight" [out/tp-ish, in] and optional "bias". A parallel attention keeps
// the plain model's names by registering these children on itself:
//   auto qkv = std::make_shared<GQAQKVColumnParallelLinear>(hidden, H*D, Hkv*D, opts);
//   register_module("q_proj", qkv->q_proj()); register_module("k_proj", qkv->k_proj()); ...
// and calling qkv->forward(x) (with tp == 1 these are exactly the plain q/k/v_proj parameters).
//
// Sharding: Q rows [r*q_out/tp, (r+1)*q_out/tp) as ColumnParallelLinear. K and V: the full
// [kv_out, in] weight is logically replicated m times head-block-wise (NxD's trn2 layout,
// repeat_interleave: K0 x m, K1 x m, ...) and split contiguously over TP, so rank r holds block
// r/m of the ORIGINAL weight, rows [(r/m)*p, (r/m+1)*p) with p = kv_out*m/tp, initialized as that
// slice of the unreplicated weight (same name, same seed). The m ranks r with the same r/m
// (adjacent ranks) hold identical K/V shards: the KV-replica group. This layout keeps each rank's
// query heads aligned with its KV heads under the standard GQA mapping (query head h reads KV
// head h / (H/Hkv)) when m = tp / Hkv; NxD's trn1 layout (W.repeat(m, 1), interleaved groups)
// would need permuted query heads, so nxd does not use it.
// Requirements (ShapeError otherwise): q_out % tp == 0, tp % m == 0, (kv_out*m) % tp == 0, and
// with head_dim > 0 every per-rank size is a whole number of heads.
//
// Collectives (tp > 1), one fused autograd function (NxD's recipe, docs/NXD_INTERNALS.md):
//   forward: no collective on X (no SP) or all-gather X along the sequence dim (SP); with
//            gather_output, q is all-gathered and k, v are all-gathered and de-replicated.
//   backward: under SP the local shard of X is re-gathered (only it was saved); dK and dV are
//            all-reduced (SUM, f32 for bf16) over the KV-replica group when m > 1, so every
//            replica computes the same dW_k, dW_v, db_k, db_v from the summed dK, dV; the input
//            gradient dQ W_q + (dK W_k + dV W_v) / m is all-reduced over TP (no SP) or
//            reduce-scattered along the sequence dim (SP): the division by m keeps the TP sum
//            from counting the m replicas m times.
// K/V parameters are tagged kv_replicas = m so the gradient norm counts them once (NxD counts
// them m times). NxD's latent bias bug (`shared_tp=` kwarg) has no counterpart here.
#include <array>
#include <cstdint>
#include <memory>

#include "nxd/layers/parallel/layers.h"

namespace nxd {

struct GQAQKVColumnParallelLinearOptions {
  bool bias = false;
  bool gather_output = false;
  bool sequence_parallel_enabled = false;
  int64_t sequence_dimension = 1;
  int64_t kv_size_multiplier = 1;
  int64_t head_dim = 0;  // > 0: check that every shard is whole heads
  ParamInit weight_init = ParamInit::fan_in_uniform();
  ParamInit bias_init = ParamInit::fan_in_uniform();
  ParamOptions param;
  std::shared_ptr<Communicator> group;
};

class GQAQKVColumnParallelLinear : public Module {
 public:
  GQAQKVColumnParallelLinear(int64_t input_size, int64_t q_out, int64_t kv_out,
                             const GQAQKVColumnParallelLinearOptions& opts = {});
  // x [..., input_size] (under SP: this rank's sequence shard) -> {q, k, v}: local
  // [..., q_out/tp], [..., kv_out*m/tp] x2, or the full [..., q_out], [..., kv_out] x2 with
  // gather_output.
  std::array<Tensor, 3> forward(const Tensor& x) const;

  const std::shared_ptr<ParallelModule>& q_proj() const { return q_proj_; }
  const std::shared_ptr<ParallelModule>& k_proj() const { return k_proj_; }
  const std::shared_ptr<ParallelModule>& v_proj() const { return v_proj_; }
  int64_t kv_size_multiplier() const { return kv_size_multiplier_; }
  int64_t local_q_size() const { return q_out_ / tp_size_; }
  int64_t local_kv_size() const { return kv_out_ * kv_size_multiplier_ / tp_size_; }
  // The group of the m ranks holding this rank's K/V shard (null when m == 1).
  const std::shared_ptr<Communicator>& kv_group() const { return kv_group_; }

 private:
  int64_t in_features_, q_out_, kv_out_, kv_size_multiplier_;
  int tp_size_;
  GQAQKVColumnParallelLinearOptions opts_;
  std::shared_ptr<Communicator> group_, kv_group_;
  std::shared_ptr<ParallelModule> q_proj_, k_proj_, v_proj_;
};

}  // namespace nxd

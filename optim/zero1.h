#pragma once
// ZeRO-1 (DeepSpeed's stage 1; NxD's NeuronZero1Optimizer(optimizer_class, ...)): an optimizer
// whose state (and the f32 master weights of bf16 parameters) is sharded over the data-parallel
// group. Any optimizer with an elementwise update shards this way (optim/elementwise.h: AdamW by
// default, SGD, Lion, or a user's ElementwiseRule in Zero1Options::rule); the text below says
// AdamW and exp_avg / exp_avg_sq for the rule and its state tensors. The gradients
// live in a GradSync's flat buckets in reduce_scatter mode (optim/grad_sync.h): every bucket is
// padded to a multiple of the DP size n and DP rank r owns elements [r*S, (r+1)*S) of each
// (S = the bucket's shard size). Each step:
//   reduce_gradients()  GradSync::finish(): the buckets are reduce-scattered with the mean (in
//                       overlap mode already launched during backward), so rank r holds the DP
//                       average of its shard of every bucket.
//   clip_grad_norm(c)   the global L2 norm over the shards (DP), TP and PP, each logical
//                       parameter counted once (TP-duplicated ones on TP rank 0, K/V replicas
//                       1/m, a tied copy marked shared not at all), as parallel_grad_norm; the
//                       shards are scaled by c / (norm + 1e-6) when that is < 1.
//   step()              AdamW (the same kernel as AdamW: bitwise the same update of an element
//                       from the same gradient, the same rounding of bf16 parameters, stochastic
//                       noise included) on this rank's shard, with the exp_avg / exp_avg_sq (and
//                       master weights) of the shard only, then an all-gather of every bucket's
//                       updated shards, in the parameters' dtype, in place: the parameters live
//                       in one flat buffer per bucket, laid out as the gradient bucket (padding
//                       included), so rank r updates its block [r*S, (r+1)*S) where it lies and
//                       the all-gather fills the others' blocks around it.
// A parameter without a gradient on every DP rank is skipped (its step count does not advance),
// as AdamW does; one with a gradient on some rank only contributes zeros elsewhere.
//
// Memory: exp_avg and exp_avg_sq (f32) of the shard per rank: 1/DP of AdamW's, plus padding; with
// master weights also the f32 masters of the shard. The gradient buckets are the parameters'
// .grad (no copy) and the reduce-scatter writes each rank's averaged block into its bucket; the
// parameters are views of flat per-bucket buffers (the constructor moves them there: a view of
// a parameter taken before construction keeps the old memory and no longer follows it). step()
// allocates nothing full-size: with f32 parameters, or master weights, nothing at all; bf16
// without master weights an f32 copy of one bucket's shard at a time (and bf16 gradients without
// f32 accumulation an f32 copy of the shard at reduce_gradients()).
//
// Checkpoints: the state is sharded (state_is_sharded()); sharded_state() gives, per parameter,
// the element range [lo, hi) of the flattened parameter that this rank's bucket shards cover
// (the parameter's part of [r*S_b, (r+1)*S_b) of its bucket b; empty for most parameters of a
// bucket at larger DP), views of exp_avg / exp_avg_sq / master of that range and the step count,
// with no communication; load_sharded_state() copies such records back (checkpoint/ writes one
// file per DP rank and reassembles them at any DP degree, docs/design/checkpoint.md "Checkpoints").
// gather_state() (collective over DP) instead fills state_tensors() with the full per-parameter
// exp_avg / exp_avg_sq / step (and master) tensors under AdamW's names (for comparing with
// AdamW); scatter_state() takes this rank's shard back from them and release_state() frees them.
//
// ZeRO-2 (Zero1Options::stage two, docs/design/fsdp.md): the same optimizer over a GradSync with
// storage shard_only: no full-size gradient bucket persists; each bucket is reduce-scattered
// straight into this rank's shard and freed, the parameters' .grad are freed as their bucket goes
// out. Everything above (norm, clipping, step, state layout, checkpoints) reads only the shards,
// so it is unchanged and the results are bitwise those of stage one.
//
// ZeRO-3 (stage three with Zero1Options::units, docs/design/fsdp.md): the same again, and the
// buckets of each unit module (a bucket holds one unit's parameters) keep only this rank's block
// of the parameters between uses: a persistent shard the step updates in place (no all-gather),
// the flat buffer's memory released; the unit (optim/zero3_unit.h, layers/param_unit.h) gathers
// it around the module's forward and backward. Zero1Options::roots make each model chunk's
// remaining parameters (final norm, head) a unit too, gathered by the model's forward, and
// Zero1Options::lookup_units its token embedding, gathered for the lookup alone.
// gather_parameters() / release_parameters() make the weights whole outside them. Parameters of no
// unit are as at stage two.
//
// Expert parallelism (NxD's two ZeRO-1 optimizers): Zero1Options.expert_params (the MoE experts'
// weights, layers/moe/moe.h) go to a second Zero1Optimizer inside this one, over the
// expert-data-parallel group: their gradients are reduce-scattered (mean) over it and their state
// sharded over it; everything else over the DP group as above. The norm adds the two sums (the
// experts' also over the EP group: each EP rank holds other experts) and clips both alike; the
// learning rates and weight decays of the groups apply to both. sharded_state() lists the dense
// parameters, then the experts: the DP files of a checkpoint still tile every state tensor once
// (an expert's pieces are in the files of its expert-DP group's ranks), so it loads at any EP.
// At stage three the experts' optimizer shards the experts' parameters over expert-DP, one unit
// per MoE layer's experts (Zero1Options::expert_units), while the layer's unit holds the rest of
// the layer, sharded over DP (x CP): docs/design/fsdp.md, "Composition". With MoE a unit's buckets
// go out as its backward releases it (Zero1Options::unit_launch at_release), and the experts'
// GradSync follows the dense one's no_sync().
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/optim/grad_norm.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/optim/optimizer.h"
#include "nxd/optim/zero_stage.h"

namespace nxd::optim {

enum class StatePlacement { device, host };

struct Zero1Options {
  AdamWOptions adamw;                      // adamw.precision: bf16 parameters (master weights, SR)
  std::shared_ptr<Communicator> dp_group;  // null: parallel_state data x context group (DP at CP 1)
  NormGroups norm_groups;                  // TP and PP groups of the norm (zero1 is dp_group)
  // The parallel attributes of the parameters, by name (parallel_parameters / norm_params of the
  // model); parameters not listed count as sharded with weight 1 in the norm.
  std::vector<NormParam> norm_params;
  // The gradient buckets: every parameter of the groups, in the order the model registers them
  // (buckets go in reverse of it, as backward produces the gradients); empty: the groups' order.
  std::vector<NamedParam> registration_order;
  int64_t bucket_bytes = int64_t{25} << 20;
  // overlap: buckets are reduce-scattered as backward finishes them (nothing may change .grad
  // between backward and step(), e.g. sequence-parallel sums must not be needed); at_step: at
  // reduce_gradients().
  GradSyncMode mode = GradSyncMode::at_step;
  bool fp32_grad_acc = true;  // bf16 parameters' gradients accumulated and reduced in f32
  // Expert parallelism: parameters of the groups sharded over expert_dp_group instead (their norm
  // summed over norm_groups.ep too, which the dense parameters' is not). Empty: none.
  std::vector<NamedParam> expert_params;
  std::shared_ptr<Communicator> expert_dp_group;  // null: the parallel_state expert-DP group
  // The update and its state (Optimizer::elementwise_rule() of the optimizer sharded); nullopt:
  // AdamW with `adamw`'s betas and eps.
  std::optional<ElementwiseRule> rule;
  // one: the state (ZeRO-1); two: the gradients too (GradStorage::shard_only); three: the
  // parameters of `units` too.
  ZeroStage stage = ZeroStage::one;
  // Stage three (ZeRO-3, docs/design/fsdp.md): the modules whose parameters are sharded over DP
  // between uses and gathered around their forward and backward (FSDP units: nxd-train's are the
  // decoder layers; their forward runs through run_param_unit, layers/param_unit.h). A bucket
  // holds one unit's parameters.
  std::vector<Module*> units;
  // Stage three: FSDP's root units, one per model chunk (the model without a pipeline; a pipeline
  // rank's parts): a root's parameters in no unit of `units` or `lookup_units` are sharded too,
  // gathered by its own forward (a CausalLM: RootUnitScope, layers/param_unit.h) and released after
  // its head's backward. None, or none of a root's parameters in the groups: those parameters stay
  // gathered as at stage two. add_root_units (optim/zero3_unit.h) fills roots and lookup_units.
  std::vector<Module*> roots;
  // Stage three: modules whose forward alone reads their weights (a token embedding), each a unit
  // gathered for its forward only and released right after it (run_lookup_unit).
  std::vector<Module*> lookup_units;
  // Stage three: per unit its prefetch chain (a pipeline chunk's layers; link_units in
  // optim/zero3_unit.h): a unit prefetches only its neighbours in the same chain. Empty: one.
  std::vector<int> unit_chain;
  // Stage three with expert_params: the experts' units (each MoE layer's `experts` module, nested
  // in its layer's unit of `units`), sharded by the experts' optimizer over expert_dp_group and
  // gathered by run_param_unit inside the MoE layer's forward (layers/moe/moe.h).
  std::vector<Module*> expert_units;
  // Stage three: the experts' units' prefetch chains (as unit_chain), one per expert unit.
  std::vector<int> expert_unit_chain;
  // Stage three: release a unit's parameters after its forward and gather them again for its
  // backward (FSDP's default); false keeps them from the forward to the end of the backward.
  bool reshard_after_forward = true;
  // Stage three: whether gathering a unit starts the next one's all-gather (optim/zero_stage.h).
  UnitPrefetch prefetch = UnitPrefetch::next_unit;
  // Stage three in overlap mode: when a unit's buckets go out (GradSyncOptions::unit_launch;
  // at_release for mixture of experts).
  UnitLaunch unit_launch = UnitLaunch::when_complete;
  // host: optimizer offload: the state and masters of the shard (and the step's f32 working copy)
  // are host memory, charged to the rank's host counter (runtime/host_memory.h), not its HBM.
  StatePlacement placement = StatePlacement::device;
};

class Zero1Optimizer : public Optimizer {
 public:
  // kind() is the rule's (a checkpoint of a ZeRO-1 Lion is a Lion's).
  Zero1Optimizer(std::vector<ParamGroup> groups, Zero1Options opts);
  ~Zero1Optimizer() override;

  void reduce_gradients();
  // Returns the norm before clipping; max_norm 0 = no clipping. Reduces first if needed.
  double clip_grad_norm(double max_norm);
  // Drops the reduced gradients of this step without an update (a step skipped because its
  // gradient norm is not finite); the next backward starts afresh.
  void discard_gradients();
  void step() override;
  void set_precision(const PrecisionOptions& p) override;

  int dp_size() const;
  int64_t shard_elements() const;  // sum of this rank's bucket shards
  ZeroStage stage() const;
  // Bytes of optimizer state this rank holds (exp_avg, exp_avg_sq and masters of its shard).
  int64_t state_bytes() const override;
  GradSync& grad_sync();  // its gradient buckets (no_sync() for gradient accumulation)
  // Optimizer offload: the seconds the last step() waited on the sim clock for the shards' round
  // trips to the host (optim/offload.h; the experts' optimizer's included); 0 without.
  double offload_wait_seconds() const;

  const AdamWOptions& options() const;  // betas and eps when the rule is AdamW's; the precision
  std::optional<ElementwiseRule> elementwise_rule() const override;
  std::vector<std::pair<std::string, double>> hyperparameters() const override;

  bool state_is_sharded() const override { return true; }
  std::vector<StateShard> sharded_state() const override;
  // InvalidArgument naming the parameter if a record's parameter, shape or range is not this
  // rank's (nothing is copied then).
  void load_sharded_state(const std::vector<StateShard>& records) override;

  void gather_state();
  void scatter_state();
  void release_state();

  // Stage three (no-ops below it): every unit's full parameters present, to read or write the
  // weights outside a forward and backward (FSDP's summon_full_params: checkpoints, tests) —
  // collective over DP; release_parameters() takes each rank's shard back from the full values
  // (written ones included) and frees them.
  void gather_parameters();
  void release_parameters();
  // Bytes of parameters this rank holds between steps (stage three: the shards of the units and
  // the parameters of no unit; below: every parameter).
  int64_t resident_parameter_bytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<Zero1Optimizer> experts_;  // the expert parameters' optimizer (expert_params)
  // Builds experts_ from `groups` (the expert parameters move there) and returns the rest.
  std::vector<ParamGroup> split_experts(std::vector<ParamGroup> groups, Zero1Options& o);
  double grad_sq_sum();  // this optimizer's squared norm, reduced over its groups
  void scale_grads(float c);
  void sync_groups();  // the groups' lr and weight decay into experts_'
};

// The squared gradient norm `local` of one ZeRO-1 optimizer's shards summed over the groups the
// norm spans, in its order: TP, PP, EP (`groups.ep`: set for an experts' optimizer only), then the
// sharding group `dp`. Zero1Optimizer::clip_grad_norm reduces with it, and nxd-plan calls it on the
// meta model's step (train_app/plan_step.cpp), so the plan charges the run's collectives.
double zero1_norm_sum(double local, const NormGroups& groups, Communicator& dp);

// ZeRO-1's update of one bucket reaching every rank: the all-gather over the sharding group `dp` of
// each rank's updated `shard_numel` elements (`mine`) into the bucket's flat buffer `flat` in place
// (null pointers: shapes only, on the sim clock; nothing at DP 1). Zero1Optimizer::step and
// nxd-plan's meta step call it.
void zero1_all_gather(Communicator& dp, const void* mine, void* flat, int64_t shard_numel,
                      DType dtype);

// The name of ZeRO-1 over AdamW, its default rule.
using Zero1AdamW = Zero1Optimizer;

}  // namespace nxd::optim

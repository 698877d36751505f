// The resident state of the plan (plan_internal.h): the gradient buckets and the optimizer state
// per reduction group, laid out as the trainer's optimizer lays them out.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/moe/moe.h"
#include "nxd/optim/offload.h"
#include "nxd/optim/zero3_unit.h"
#include "nxd/runtime/context.h"
#include "nxd/train_app/plan_internal.h"

namespace nxd::train_app::detail {

namespace {

// Optimizer state bytes per parameter element (AdamW: two f32 moments, and an f32 master of a
// bf16 parameter with master weights; SGD: its momentum; Lion: one moment).
int64_t state_bytes_per_element(const TrainConfig& cfg, DType dtype, bool masters) {
  const int64_t master = masters && dtype == DType::bf16 ? 4 : 0;
  if (cfg.optim.name == "sgd") return (cfg.optim.momentum > 0 ? 4 : 0) + master;
  if (cfg.optim.name == "lion") return 4 + master;
  return 8 + master;
}

// The dense parameters over data x context parallel; at EP > 1 the experts' weights apart, over
// the expert-data-parallel group (NxDOptimizer: at EP 1 they are dense parameters).
std::vector<ReductionGroup> reduction_groups(const MetaModel& mm) {
  namespace ps = parallel_state;
  std::vector<ReductionGroup> g(1);
  g[0].group = ps::get_data_context_parallel_group_ptr();
  if (ps::get_expert_model_parallel_size() == 1) {
    g[0].params = mm.params;
    return g;
  }
  std::unordered_set<const TensorImpl*> is_expert;
  for (const auto& c : mm.chunks)
    for (const Tensor& t : moe_expert_parameters(*c)) is_expert.insert(t.impl());
  ReductionGroup e;
  e.experts = true;
  e.group = ps::get_expert_data_parallel_group_ptr();
  for (const auto& p : mm.params)
    (is_expert.count(p.param.impl()) ? e.params : g[0].params).push_back(p);
  if (!e.params.empty()) g.push_back(std::move(e));
  return g;
}

// ZeRO-1 (optim/zero1.h): the group's padded flat parameter buffers, its shard of the state, and
// the step's f32 copies (of bf16 gradient shards, all buckets; of one bucket's bf16 parameter
// shard without master weights: returned, the largest).
int64_t zero1_state(const TrainConfig& cfg, const api::ResolvedPrecision& rp,
                    const ReductionGroup& g, RankMemory& r) {
  const optim::GradSync& sync = *g.sync;
  const int64_t n = g.group->size();
  const auto layout = sync.bucket_layout();
  int64_t transient = 0;
  for (int b = 0; b < sync.num_buckets(); ++b) {
    const DType pd = g.params[static_cast<size_t>(layout[b][0])].param.dtype();
    int64_t numel = 0;
    for (int i : layout[b]) numel += g.params[static_cast<size_t>(i)].param.numel();
    const int64_t shard = sync.shard_numel(b);
    // the flat buffer's padding (ZeRO-3's units: measured by shard_meta_units)
    if (g.unit_of.empty() || g.unit_of[static_cast<size_t>(layout[b][0])] == 0)
      r.parameters += (shard * n - numel) * dtype_size(pd);
    // optimizer offload: the state, masters and the step's working copy in host memory
    const bool host = cfg.dist.optimizer_offload;
    (host ? r.host_optimizer_state : r.optimizer_state) +=
        shard * state_bytes_per_element(cfg, pd, rp.master_weights);
    if (pd == DType::bf16 && !rp.fp32_grad_acc) r.collective_buffers += shard * 4;
    if (pd == DType::bf16 && !rp.master_weights && !host)
      transient = std::max(transient, shard * 4);
  }
  return transient;
}

// Whether nxd-train's ZeRO-3 buckets go out during backward with one microbatch a step (no
// pipeline, no sequence-parallel sums before the reduction; with mixture of experts each unit's
// as its backward releases it).
bool overlaps(const TrainConfig& cfg) {
  return cfg.grad_accum_steps == 1 && cfg.dist.pipeline_model_parallel_size == 1 &&
         !(cfg.dist.sequence_parallel && cfg.dist.tensor_model_parallel_size > 1);
}

// ZeRO-2: the bytes of the largest bucket buffer (padded to n shards).
int64_t largest_bucket_bytes(const optim::GradSync& sync, int64_t n) {
  int64_t most = 0;
  for (int b = 0; b < sync.num_buckets(); ++b)
    most = std::max(most, sync.shard_numel(b) * n * dtype_size(sync.bucket_dtype(b)));
  return most;
}

// ZeRO-3's units and each parameter's unit (g.unit_of), as NxDOptimizer makes them: the decoder
// layers of the meta model's chunks, each chained to its chunk, and every chunk's root and lookup
// units (optim::add_root_units); for the experts' group (EP > 1) each MoE layer's experts.
optim::UnitModules unit_modules(const MetaModel& mm, ReductionGroup& g) {
  optim::UnitModules m;
  for (size_t c = 0; c < mm.chunks.size(); ++c)
    if (const DecoderStack* s = mm.chunks[c]->decoder_stack())
      for (const auto& l : s->layers()) {
        const std::vector<Module*> mods =
            g.experts ? moe_expert_modules(*l) : std::vector<Module*>{l.get()};
        m.layers.insert(m.layers.end(), mods.begin(), mods.end());
        m.chain.resize(m.layers.size(), static_cast<int>(c));
      }
  if (!g.experts) {
    std::vector<Module*> chunks;
    for (const auto& c : mm.chunks) chunks.push_back(c.get());
    optim::add_root_units(chunks, m);
    // nxd-train keeps a pipeline's head whole (optimizer_config.zero3_pipeline_head's default)
    if (mm.pipe) m.roots.clear();
  }
  g.unit_of = m.unit_of(g.params);
  return m;
}

}  // namespace

std::vector<ReductionGroup> plan_resident_state(const TrainConfig& cfg,
                                                const api::ResolvedPrecision& rp,
                                                const MetaModel& mm, RankMemory& r) {
  MemoryCounter& mem = current_context().memory();
  std::vector<ReductionGroup> groups = reduction_groups(mm);
  const bool zero1 = cfg.dist.zero1();
  int64_t step_transient = 0;  // ZeRO-1: the largest bucket's f32 working copy (groups in turn)
  for (ReductionGroup& g : groups) {
    // gradients: the optimizer's buckets (GradSync's layout); without them .grad per parameter,
    // measured by the first backward (plan.cpp)
    const bool buckets =
        g.group->size() > 1 || zero1 || (rp.param_dtype == DType::bf16 && rp.fp32_grad_acc);
    const int64_t before = mem.live();
    if (buckets) {
      optim::GradSyncOptions go;
      go.bucket_bytes = static_cast<int64_t>(cfg.dist.grad_bucket_mb * (1 << 20));
      go.mode = optim::GradSyncMode::at_step;
      go.group = g.group;
      go.reduction = zero1 ? optim::DpReduction::reduce_scatter : optim::DpReduction::all_reduce;
      go.fp32_grad_acc = rp.fp32_grad_acc;
      // ZeRO-2: only the shards stay; the backward's fresh .grads are measured with the
      // activations (plan.cpp) and at most two bucket buffers are in flight (optim/grad_sync.h)
      const bool zero2 = cfg.dist.zero_stage == optim::ZeroStage::two;
      const bool zero3 = cfg.dist.zero_stage == optim::ZeroStage::three;
      if (zero2 || zero3) go.storage = optim::GradStorage::shard_only;
      optim::UnitModules units;
      if (zero3) {
        units = unit_modules(mm, g);
        go.units = g.unit_of;
        // ZeRO-3: the trainer's buckets go out during the last backward (api/nxd_optimizer.cpp),
        // so its .grads are freed bucket by bucket; the plan's measured backward does the same
        // when the step has one microbatch (with more, the full .grads accumulate first)
        if (overlaps(cfg)) go.mode = optim::GradSyncMode::overlap;
        if (cfg.model.moe.enabled()) go.unit_launch = optim::UnitLaunch::at_release;
        go.first_root_unit = units.first_root_unit();
      }
      g.sync = std::make_unique<optim::GradSync>(g.params, go);
      if (zero2 || (zero3 && go.mode == optim::GradSyncMode::at_step))
        step_transient =
            std::max(step_transient, 2 * largest_bucket_bytes(*g.sync, g.group->size()));
      if (zero3) {
        r.gradients += mem.live() - before;
        const int64_t at = mem.live();
        optim::shard_meta_units(*g.sync, g.unit_of, units, g.group, cfg.dist.reshard_after_forward,
                                cfg.dist.zero3_prefetch);
        r.parameters += mem.live() - at;  // the units' shards in place of their full weights
        if (zero1) step_transient = std::max(step_transient, zero1_state(cfg, rp, g, r));
        continue;
      }
    }
    r.gradients += mem.live() - before;
    if (zero1) {
      step_transient = std::max(step_transient, zero1_state(cfg, rp, g, r));
      continue;
    }
    for (const auto& p : g.params) {
      const DType pd = p.param.dtype();
      r.optimizer_state += p.param.numel() * state_bytes_per_element(cfg, pd, rp.master_weights);
      // the step works on f32 copies of bf16 values without masters and of bf16 gradients
      if (pd == DType::bf16)
        r.collective_buffers +=
            p.param.numel() * ((rp.master_weights ? 0 : 4) + (rp.fp32_grad_acc ? 0 : 4));
    }
  }
  r.collective_buffers += step_transient;
  return groups;
}

}  // namespace nxd::train_app::detail

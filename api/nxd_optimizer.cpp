#include "nxd/api/nxd_optimizer.h"

#include <cmath>
#include <unordered_set>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/moe/moe.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/layers/param_unit.h"
#include "nxd/optim/zero3_unit.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"

namespace nxd::api {

namespace {

// The group gradients are reduced over and ZeRO-1 shards over: data x context parallel (the DP
// group at CP 1).
std::shared_ptr<Communicator> dp_group() {
  return parallel_state::model_parallel_is_initialized()
             ? parallel_state::get_data_context_parallel_group_ptr()
             : make_self_communicator();
}

// The optimizer's parameters in the model's registration order (the buckets' order); a
// parameter the model does not hold is a ConfigError naming it.
std::vector<optim::NamedParam> in_model_order(const NxDModel& model, const optim::Optimizer& o) {
  std::unordered_set<const TensorImpl*> mine;
  for (const auto& p : o.named_parameters()) mine.insert(p.param.impl());
  std::vector<optim::NamedParam> out;
  std::unordered_set<const TensorImpl*> held;
  for (const auto& p : model.local_named_parameters()) {
    held.insert(p.param.impl());
    if (mine.count(p.param.impl())) out.push_back(p);
  }
  for (const auto& p : o.named_parameters())
    NXD_CHECK_T(ConfigError, held.count(p.param.impl()), "[NxDOptimizer] parameter '", p.name,
                "' of the optimizer is not one of the model's local parameters");
  return out;
}

// ZeRO-3's units: the decoder layers of the model's DecoderStacks (their forward runs through
// run_param_unit), sharded over DP x CP, and per unit its prefetch chain: the index of its
// DecoderStack (a pipeline rank has one per chunk); a model without one is a ConfigError.
std::vector<Module*> zero3_units(const NxDConfig& cfg, const NxDModel& model, int ep,
                                 std::vector<int>& chain) {
  const char* stage = "[NxDOptimizer] optimizer_config.zero_stage=3";
  std::vector<Module*> units;
  for (Module* m : model.local_modules()) {
    for (auto& [name, sub] : m->named_modules())
      if (const auto* stack = dynamic_cast<const DecoderStack*>(sub)) {
        for (const auto& l : stack->layers()) units.push_back(l.get());
        chain.resize(units.size(), chain.empty() ? 0 : chain.back() + 1);
      }
  }
  NXD_CHECK_T(ConfigError, !units.empty(), stage,
              " needs a model whose decoder layers are ZeRO-3 units (a DecoderStack's); this "
              "model has none");
  return units;
}

// ZeRO-3 with expert parallelism: each MoE layer's experts, a unit nested in its layer's (in
// forward order, in its layer's prefetch chain), sharded by the experts' optimizer over expert-DP
// while the layer's unit holds the dense parameters over DP x CP. At EP 1 the experts are dense
// parameters of the layer's unit.
std::vector<Module*> zero3_expert_units(const std::vector<Module*>& layers,
                                        const std::vector<int>& layer_chain,
                                        std::vector<int>& chain) {
  std::vector<Module*> units;
  for (size_t l = 0; l < layers.size(); ++l)
    for (Module* e : moe_expert_modules(*layers[l])) {
      units.push_back(e);
      chain.push_back(l < layer_chain.size() ? layer_chain[l] : 0);
    }
  return units;
}

}  // namespace

NxDOptimizer::NxDOptimizer(const NxDConfig& cfg, NxDModel& model,
                           std::unique_ptr<optim::Optimizer> inner, optim::GradSyncMode sync)
    : cfg_(cfg), model_(model) {
  NXD_CHECK_T(ConfigError, inner != nullptr, "[NxDOptimizer] no optimizer");
  // a model a ZeRO-3 optimizer sharded before this one comes back whole
  remove_param_units(model_.local_modules());
  norm_params_ = model_.norm_params();
  groups_ = model_.norm_groups();
  sp_sums_ = model_.needs_sequence_parallel_sums();
  const ResolvedPrecision rp = resolve_precision(cfg_);
  // stochastic rounding draws from the run's seed (every rank's Context has the same one)
  const optim::PrecisionOptions prec{rp.master_weights, rp.stochastic_rounding,
                                     current_context().rng().seed() ^ 0x5352u};
  std::vector<optim::NamedParam> order = in_model_order(model_, *inner);
  const int ep = parallel_state::model_parallel_is_initialized()
                     ? parallel_state::get_expert_model_parallel_size()
                     : 1;
  std::vector<optim::NamedParam> experts;
  if (ep > 1) {
    std::unordered_set<const TensorImpl*> is_expert;
    for (Module* m : model_.local_modules())
      for (const Tensor& t : moe_expert_parameters(*m)) is_expert.insert(t.impl());
    std::vector<optim::NamedParam> dense;
    for (auto& p : order) (is_expert.count(p.param.impl()) ? experts : dense).push_back(p);
    order = std::move(dense);
  }
  // Mixture of experts: an expert that no token of this rank reached has no gradient here, so
  // its bucket would go out in backward on the other ranks and only at the step on this one (a
  // mismatched collective order: a deadlock at DP > 1, EP 1); reduce at the step. EP > 1 also has
  // two groups whose buckets must not interleave in backward.
  bool moe = ep > 1;
  for (Module* m : model_.local_modules()) moe = moe || !moe_layers(*m).empty();
  const int64_t bucket = static_cast<int64_t>(cfg_.grad_bucket_mb * (1 << 20));
  const optim::ZeroStage stage = cfg_.optimizer_config.stage();
  std::vector<int> unit_chain;
  const std::vector<Module*> units = stage == optim::ZeroStage::three
                                         ? zero3_units(cfg_, model_, ep, unit_chain)
                                         : std::vector<Module*>{};
  const bool zero1 = stage != optim::ZeroStage::none;
  NXD_CHECK_T(
      ConfigError, zero1 || !cfg_.optimizer_config.optimizer_offload,
      "[NxDOptimizer] optimizer_config.optimizer_offload=true needs "
      "optimizer_config.zero_stage 1, 2 or 3: only the sharded optimizer's state is offloaded");
  // buckets go out during backward unless something must reach .grad before the reduction
  const auto mode =
      sync == optim::GradSyncMode::at_step || model_.is_pipeline() || (zero1 && sp_sums_)
          ? optim::GradSyncMode::at_step
          : optim::GradSyncMode::overlap;
  if (zero1) {
    std::optional<optim::ElementwiseRule> rule = inner->elementwise_rule();
    NXD_CHECK_T(ConfigError, rule.has_value(), "[NxDOptimizer] optimizer_config.zero_stage ",
                optim::zero_stage_name(stage),
                " (zero_one_enabled: 1) shards optimizers whose update "
                "is elementwise (Optimizer::elementwise_rule: AdamW, SGD, Lion, an "
                "ElementwiseOptimizer), got ",
                inner->kind(), ", which gives none");
    optim::Zero1Options zo;
    if (const auto* adamw = dynamic_cast<const optim::AdamW*>(inner.get()))
      zo.adamw = adamw->options();
    zo.rule = std::move(rule);
    zo.adamw.precision = prec;
    zo.dp_group = dp_group();
    zo.norm_groups = groups_;
    zo.norm_params = norm_params_;
    zo.registration_order = order;
    zo.bucket_bytes = bucket;
    // ZeRO-3 with MoE: each unit's buckets go out as its backward releases it, at the same point
    // on every rank whatever the routing (and the experts' between the exchanges, in the same
    // order on every rank), so they may overlap the backward
    const bool three = stage == optim::ZeroStage::three;
    zo.mode = moe && !three ? optim::GradSyncMode::at_step : mode;
    zo.unit_launch = moe ? optim::UnitLaunch::at_release : optim::UnitLaunch::when_complete;
    // expert parallelism: NxD's second ZeRO-1 optimizer, over the expert-DP group
    zo.expert_params = experts;
    zo.registration_order.insert(zo.registration_order.end(), experts.begin(), experts.end());
    if (!experts.empty())
      zo.expert_dp_group = parallel_state::get_expert_data_parallel_group_ptr();
    else
      zo.norm_groups.ep = nullptr;
    zo.fp32_grad_acc = rp.fp32_grad_acc;
    zo.stage = stage;
    zo.units = units;
    zo.unit_chain = unit_chain;
    if (stage == optim::ZeroStage::three) {
      // FSDP's root unit of each chunk that is a CausalLM (the embedding a lookup unit of its own);
      // under a pipeline only the head's stage has a root, kept whole unless asked
      optim::UnitModules roots;
      optim::add_root_units(model_.local_modules(), roots);
      if (model_.is_pipeline() &&
          cfg_.optimizer_config.zero3_pipeline_head == optim::PipelineHeadUnit::whole)
        roots.roots.clear();
      zo.roots = roots.roots;
      zo.lookup_units = roots.lookups;
    }
    if (!experts.empty())
      zo.expert_units = zero3_expert_units(units, unit_chain, zo.expert_unit_chain);
    zo.reshard_after_forward = cfg_.optimizer_config.reshard_after_forward;
    zo.prefetch = cfg_.optimizer_config.zero3_prefetch;
    zo.placement = cfg_.optimizer_config.optimizer_offload ? optim::StatePlacement::host
                                                           : optim::StatePlacement::device;
    std::vector<optim::ParamGroup> groups = inner->param_groups();
    inner.reset();  // the full state (unless deferred) goes before ZeRO-1's is allocated
    auto z = std::make_unique<optim::Zero1Optimizer>(std::move(groups), std::move(zo));
    zero1_ = z.get();
    inner_ = std::move(z);
    return;
  }
  inner->set_precision(prec);
  inner_ = std::move(inner);
  optim::GradSyncOptions go;
  go.bucket_bytes = bucket;
  go.mode = moe ? optim::GradSyncMode::at_step : mode;
  go.group = dp_group();
  go.fp32_grad_acc = rp.fp32_grad_acc;
  sync_ = std::make_unique<optim::GradSync>(order, go);
  if (!experts.empty()) {
    go.group = parallel_state::get_expert_data_parallel_group_ptr();
    expert_sync_ = std::make_unique<optim::GradSync>(experts, go);
  }
}

NxDOptimizer::~NxDOptimizer() = default;

void NxDOptimizer::step() {
  reduce_and_clip_once();
  reduced_ = false;
  inner_->step();
}

bool NxDOptimizer::step_if_finite(double loss) {
  reduce_and_clip_once();
  reduced_ = false;
  if (std::isfinite(loss) && std::isfinite(*grad_norm_)) {
    inner_->step();
    return true;
  }
  if (zero1_) zero1_->discard_gradients();
  return false;
}

double NxDOptimizer::clip_grad_norm(double max_norm) {
  NXD_CHECK(max_norm >= 0, "[NxDOptimizer] clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  if (!reduced_) reduce();
  reduced_ = true;
  return clip(max_norm);
}

void NxDOptimizer::reduce_and_clip_once() {
  const auto& oc = cfg_.optimizer_config;
  if (reduced_) return;
  reduce();
  clip(oc.grad_clipping ? oc.max_grad_norm : 0.0);
}

void NxDOptimizer::reduce() {
  auto sp_sums = [&] {
    if (sp_sums_)
      for (Module* m : model_.local_modules()) allreduce_sequence_parallel_gradients(*m);
  };
  if (zero1_) {
    sp_sums();  // before the reduce-scatter (at_step mode), which clip() runs
  } else {
    sync_->finish();
    if (expert_sync_) expert_sync_->finish();
    sp_sums();  // after the DP mean: they commute
  }
}

double NxDOptimizer::clip(double max_norm) {
  if (zero1_)
    grad_norm_ = zero1_->clip_grad_norm(max_norm);  // reduce-scatters first (once per step)
  else
    grad_norm_ = max_norm > 0 ? optim::clip_parallel_grad_norm(norm_params_, max_norm, groups_)
                              : optim::parallel_grad_norm(norm_params_, groups_);
  return *grad_norm_;
}

namespace {
std::unique_ptr<optim::Optimizer> make_optimizer(std::vector<optim::ParamGroup> groups,
                                                 const OptimizerOptions& options) {
  if (const auto* a = std::get_if<optim::AdamWOptions>(&options))
    return std::make_unique<optim::AdamW>(std::move(groups), *a);
  if (const auto* l = std::get_if<optim::LionOptions>(&options))
    return std::make_unique<optim::Lion>(std::move(groups), *l);
  return std::make_unique<optim::SGD>(std::move(groups), std::get<optim::SGDOptions>(options));
}
}  // namespace

std::unique_ptr<NxDOptimizer> initialize_parallel_optimizer(const NxDConfig& cfg, NxDModel& model,
                                                            std::vector<optim::ParamGroup> groups,
                                                            OptimizerOptions options) {
  return std::make_unique<NxDOptimizer>(cfg, model, make_optimizer(std::move(groups), options));
}

std::unique_ptr<NxDOptimizer> initialize_parallel_optimizer(const NxDConfig& cfg, NxDModel& model,
                                                            std::vector<optim::ParamGroup> groups,
                                                            const OptimizerFactory& make) {
  NXD_CHECK_T(ConfigError, make != nullptr, "[initialize_parallel_optimizer] no optimizer factory");
  std::unique_ptr<optim::Optimizer> o = make(std::move(groups));
  NXD_CHECK_T(ConfigError, o != nullptr,
              "[initialize_parallel_optimizer] the optimizer factory returned no optimizer");
  return std::make_unique<NxDOptimizer>(cfg, model, std::move(o));
}

namespace {
// A non-owning NxDModel around a plain module: the caller keeps the module alive.
std::shared_ptr<NxDModel> wrap(const NxDConfig& cfg, Module& model) {
  return std::make_shared<NxDModel>(cfg,
                                    std::shared_ptr<Module>(std::shared_ptr<Module>(), &model));
}
}  // namespace

std::unique_ptr<NxDOptimizer> initialize_parallel_optimizer(const NxDConfig& cfg, Module& model,
                                                            std::vector<optim::ParamGroup> groups,
                                                            OptimizerOptions options) {
  auto wrapper = wrap(cfg, model);
  auto opt = initialize_parallel_optimizer(cfg, *wrapper, std::move(groups), std::move(options));
  opt->keep(std::move(wrapper));
  return opt;
}

std::unique_ptr<NxDOptimizer> initialize_parallel_optimizer(const NxDConfig& cfg, Module& model,
                                                            std::vector<optim::ParamGroup> groups,
                                                            const OptimizerFactory& make) {
  auto wrapper = wrap(cfg, model);
  auto opt = initialize_parallel_optimizer(cfg, *wrapper, std::move(groups), make);
  opt->keep(std::move(wrapper));
  return opt;
}

}  // namespace nxd::api

#include "nxd/trainer/nxd_api.h"

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"

namespace nxd::trainer {

NxDConfig NxDConfig::from_json(const nlohmann::json& j) {
  NxDConfig c;
  if (!j.is_object()) throw ConfigError(str("[NxDConfig] expected a mapping, got ", j.dump()));
  try {
    for (const auto& [k, v] : j.items()) {
      if (k == "tensor_parallel_size") {
        c.tensor_parallel_size = v.get<int>();
      } else if (k == "pipeline_parallel_size") {
        c.pipeline_parallel_size = v.get<int>();
      } else if (k == "sequence_parallel") {
        c.sequence_parallel = v.get<bool>();
      } else if (k == "activation_checkpoint_config") {
        c.activation_checkpoint_config = v.is_null() ? "" : v.get<std::string>();
      } else if (k == "optimizer_config") {
        for (const auto& [ok, ov] : v.items()) {
          if (ok == "zero_one_enabled")
            c.optimizer_config.zero_one_enabled = ov.get<bool>();
          else if (ok == "grad_clipping")
            c.optimizer_config.grad_clipping = ov.get<bool>();
          else if (ok == "max_grad_norm")
            c.optimizer_config.max_grad_norm = ov.get<double>();
          else
            throw ConfigError(str("[NxDConfig] unknown key optimizer_config.", ok));
        }
      } else {
        throw ConfigError(str("[NxDConfig] unknown key '", k,
                              "' (known: tensor_parallel_size, pipeline_parallel_size, "
                              "sequence_parallel, activation_checkpoint_config, "
                              "optimizer_config)"));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(str("[NxDConfig] ", j.dump(), ": ", e.what()));
  }
  return c;
}

NxDConfig neuronx_distributed_config(NxDConfig c) {
  auto fail = [](auto&&... a) { throw ConfigError(str("[neuronx_distributed_config] ", a...)); };
  if (c.tensor_parallel_size < 1 || c.pipeline_parallel_size < 1)
    fail("tensor_parallel_size and pipeline_parallel_size must be >= 1, got ",
         c.tensor_parallel_size, " and ", c.pipeline_parallel_size);
  const int world = current_context().world_size();
  if (world % (c.tensor_parallel_size * c.pipeline_parallel_size) != 0)
    fail("the world of ", world, " rank(s) is not tensor_parallel_size ", c.tensor_parallel_size,
         " x pipeline_parallel_size ", c.pipeline_parallel_size, " x a data-parallel size");
  const std::string& ac = c.activation_checkpoint_config;
  if (!ac.empty() && ac != "full" && ac != "selective")
    fail("activation_checkpoint_config must be empty, full or selective, got '", ac, "'");
  if (c.optimizer_config.grad_clipping && !(c.optimizer_config.max_grad_norm > 0))
    fail("optimizer_config.max_grad_norm must be > 0 with grad_clipping, got ",
         c.optimizer_config.max_grad_norm);
  if (!(c.grad_bucket_mb > 0)) fail("grad_bucket_mb must be > 0, got ", c.grad_bucket_mb);
  if (!parallel_state::model_parallel_is_initialized()) {
    parallel_state::initialize_model_parallel(c.tensor_parallel_size, c.pipeline_parallel_size);
  } else if (parallel_state::get_tensor_model_parallel_size() != c.tensor_parallel_size ||
             parallel_state::get_pipeline_model_parallel_size() != c.pipeline_parallel_size) {
    fail("parallel_state is already initialized with tensor x pipeline parallel size ",
         parallel_state::get_tensor_model_parallel_size(), " x ",
         parallel_state::get_pipeline_model_parallel_size(), ", the config asks for ",
         c.tensor_parallel_size, " x ", c.pipeline_parallel_size);
  }
  return c;
}

namespace {
std::unique_ptr<optim::Optimizer> make_optimizer(std::vector<optim::ParamGroup> groups,
                                                 const OptimizerOptions& options) {
  if (const auto* a = std::get_if<optim::AdamWOptions>(&options))
    return std::make_unique<optim::AdamW>(std::move(groups), *a);
  return std::make_unique<optim::SGD>(std::move(groups), std::get<optim::SGDOptions>(options));
}
}  // namespace

NxDOptimizer::NxDOptimizer(const NxDConfig& cfg, Module& model,
                           std::vector<optim::ParamGroup> groups, OptimizerOptions options)
    : cfg_(cfg), model_(model) {
  init(make_optimizer(std::move(groups), options));
}

NxDOptimizer::NxDOptimizer(const NxDConfig& cfg, Module& model,
                           std::unique_ptr<optim::Optimizer> inner)
    : cfg_(cfg), model_(model) {
  init(std::move(inner));
}

void NxDOptimizer::init(std::unique_ptr<optim::Optimizer> inner) {
  NXD_CHECK(inner != nullptr, "[NxDOptimizer] no optimizer");
  norm_params_ = optim::norm_params(model_);
  groups_ = optim::NormGroups::from_parallel_state();
  for (const auto& p : norm_params_)
    sequence_parallel_ = sequence_parallel_ || p.attrs.sequence_parallel_enabled;
  if (cfg_.optimizer_config.zero_one_enabled) {
    const auto* adamw = dynamic_cast<const optim::AdamW*>(inner.get());
    NXD_CHECK_T(ConfigError, adamw != nullptr,
                "[NxDOptimizer] optimizer_config.zero_one_enabled shards AdamW's state, got ",
                inner->kind());
    optim::Zero1Options zo{adamw->options(), parallel_state::get_data_parallel_group_ptr(), groups_,
                           norm_params_};
    auto z = std::make_unique<optim::Zero1AdamW>(inner->param_groups(), std::move(zo));
    zero1_ = z.get();
    inner_ = std::move(z);
    return;
  }
  inner_ = std::move(inner);
  sync_ = std::make_unique<optim::GradSync>(
      model_, optim::GradSyncOptions{static_cast<int64_t>(cfg_.grad_bucket_mb * (1 << 20))});
}

optim::GradSync::NoSync NxDOptimizer::no_sync() {
  NXD_CHECK(sync_ != nullptr,
            "[NxDOptimizer] no_sync() is for the all-reduce path (ZeRO-1 reduces at step())");
  return sync_->no_sync();
}

void NxDOptimizer::step() {
  const auto& oc = cfg_.optimizer_config;
  if (zero1_) {
    if (sequence_parallel_) allreduce_sequence_parallel_gradients(model_);
    grad_norm_ = zero1_->clip_grad_norm(oc.grad_clipping ? oc.max_grad_norm : 0.0);
  } else {
    // the DP average first: with buckets filled from backward hooks the SP sums go after it
    // (sum over TP and mean over DP commute; docs/DESIGN.md, parallel layers)
    sync_->finish();
    if (sequence_parallel_) allreduce_sequence_parallel_gradients(model_);
    grad_norm_ = oc.grad_clipping
                     ? optim::clip_parallel_grad_norm(norm_params_, oc.max_grad_norm, groups_)
                     : optim::parallel_grad_norm(norm_params_, groups_);
  }
  inner_->step();
}

std::unique_ptr<NxDOptimizer> initialize_parallel_optimizer(const NxDConfig& cfg, Module& model,
                                                            std::vector<optim::ParamGroup> groups,
                                                            OptimizerOptions options) {
  return std::make_unique<NxDOptimizer>(cfg, model, std::move(groups), std::move(options));
}

}  // namespace nxd::trainer

#pragma once
// NxD's training API in C++ (the API guide's neuronx_distributed_config and
// initialize_parallel_optimizer): for a research prototype that writes its own model and loop,
// the parallel layout and the optimizer step NxD's way, without wiring parallel_state, gradient
// sync, clipping and ZeRO-1 by hand.
//
//   auto cfg = nxd::trainer::neuronx_distributed_config({.tensor_parallel_size = 2});
//   auto model = std::make_shared<MyModel>();            // built from NxD's parallel layers
//   auto opt = nxd::trainer::initialize_parallel_optimizer(cfg, *model,
//                  optim::default_param_groups(named, 1e-3, 0.01), optim::AdamWOptions{});
//   for (...) { backward(model->loss(batch)); opt->step(); opt->zero_grad(); }
//
// NxDOptimizer::step() does, in NxD's order (trainer/optimizer.py): the sequence-parallel
// gradients' sum over TP, the data-parallel average (GradSync's buckets, overlapped with
// backward) or ZeRO-1's reduce-scatter, the global norm over TP/PP/DP (clipped to
// max_grad_norm when grad_clipping), then the update; grad_norm() reads the norm afterwards.
// The Trainer (trainer.h) runs its data-parallel path on this same optimizer.
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "nxd/layers/module.h"
#include "nxd/optim/grad_norm.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/optim/optimizer.h"
#include "nxd/optim/zero1.h"

namespace nxd::trainer {

struct OptimizerConfig {
  bool zero_one_enabled = false;  // ZeRO-1 (AdamW only)
  bool grad_clipping = true;
  double max_grad_norm = 1.0;
};

// NxD's neuronx_distributed_config keys and defaults (those nxd implements).
struct NxDConfig {
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  OptimizerConfig optimizer_config;
  bool sequence_parallel = false;
  // "" (none), "full" or "selective": for the built-in models' activations_checkpoint_granularity
  std::string activation_checkpoint_config;
  double grad_bucket_mb = 25.0;  // the DP all-reduce buckets (DDP's bucket_cap_mb)

  // NxD's keys from JSON (or YAML parsed to JSON): tensor_parallel_size,
  // pipeline_parallel_size, sequence_parallel, activation_checkpoint_config, optimizer_config
  // {zero_one_enabled, grad_clipping, max_grad_norm}; unknown keys are a ConfigError naming them.
  static NxDConfig from_json(const nlohmann::json& j);
};

// Checks `cfg` (ConfigError naming the values: sizes, a world not divisible by tp x pp, a bad
// checkpoint kind, max_grad_norm <= 0 with clipping) and initializes parallel_state on the
// current context unless it is already initialized with these sizes. Collective.
NxDConfig neuronx_distributed_config(NxDConfig cfg = {});

using OptimizerOptions = std::variant<optim::AdamWOptions, optim::SGDOptions>;

class NxDOptimizer {
 public:
  NxDOptimizer(const NxDConfig& cfg, Module& model, std::vector<optim::ParamGroup> groups,
               OptimizerOptions options);
  // Around an optimizer already built over `model`'s parameters (a TrainingModule's
  // configure_optimizers); with zero_one_enabled an AdamW becomes a Zero1AdamW over its groups.
  NxDOptimizer(const NxDConfig& cfg, Module& model, std::unique_ptr<optim::Optimizer> inner);
  void step();
  void zero_grad() { inner_->zero_grad(/*set_to_none=*/true); }
  double grad_norm() const { return grad_norm_; }  // of the last step, before clipping
  void set_lr(double lr) { inner_->set_lr(lr); }
  optim::Optimizer& inner() { return *inner_; }
  // Gradient accumulation: backward passes under no_sync() do not launch DP all-reduces.
  optim::GradSync::NoSync no_sync();
  optim::GradSync* grad_sync() { return sync_.get(); }  // null with ZeRO-1

 private:
  void init(std::unique_ptr<optim::Optimizer> inner);
  NxDConfig cfg_;
  Module& model_;
  std::unique_ptr<optim::Optimizer> inner_;
  optim::Zero1AdamW* zero1_ = nullptr;
  std::unique_ptr<optim::GradSync> sync_;
  std::vector<optim::NormParam> norm_params_;
  optim::NormGroups groups_;
  bool sequence_parallel_ = false;
  double grad_norm_ = 0;
};

// NxD's initialize_parallel_optimizer: the optimizer of `options`' kind (AdamW or SGD) over
// `groups` of `model`'s parameters, with `cfg`'s DP sync or ZeRO-1 and clipping.
std::unique_ptr<NxDOptimizer> initialize_parallel_optimizer(const NxDConfig& cfg, Module& model,
                                                            std::vector<optim::ParamGroup> groups,
                                                            OptimizerOptions options);

}  // namespace nxd::trainer

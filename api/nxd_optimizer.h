#pragma once
// NxD's initialize_parallel_optimizer and NxDOptimizer in C++. step() runs, in NxD's order
// (trainer/optimizer.py), everything between backward and the update:
//   - the sum of sequence-parallel gradients over TP (a pipeline did it in run_train);
//   - the data-parallel reduction of the gradients in flat buckets that are the parameters'
//     .grad (optim/grad_sync.h): an all-reduce (mean), launched from backward hooks so it overlaps
//     backward, or with ZeRO-1 a reduce-scatter (mean) whose shards the sharded AdamW steps
//     (with expert parallelism the MoE experts' weights over the expert-DP group, ZeRO-1 too);
//   - the global gradient norm over TP, PP and DP (each logical parameter once), clipped to
//     max_grad_norm when grad_clipping;
//   - the update: bf16 parameters through f32 master weights or stochastic rounding as the
//     precision says (optim/precision.h), ZeRO-1's shards all-gathered into the parameters.
// grad_norm() reads the norm of the last step. zero_grad() sets .grad to none (the buckets stay
// the parameters' gradient buffers).
//
// Sequence parallelism with overlapped buckets: the SP sums go after the DP all-reduce (sum over TP
// and mean over DP commute, docs/design/optim.md); with ZeRO-1 or a pipeline the buckets are
// reduced at step() (SP sums and the tied-embedding sum must reach .grad first).
#include <functional>
#include <memory>
#include <optional>
#include <variant>
#include <vector>

#include "nxd/api/nxd_model.h"
#include "nxd/optim/elementwise_optimizer.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/optim/optimizer.h"
#include "nxd/optim/zero1.h"

namespace nxd::api {

using OptimizerOptions = std::variant<optim::AdamWOptions, optim::SGDOptions, optim::LionOptions>;
// NxD's optimizer_class with its **defaults: builds any optimizer (optim::Optimizer: state
// tensors per parameter) over the groups it is given.
using OptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

class NxDOptimizer {
 public:
  // Around an optimizer already built over `model`'s local parameters (a TrainingModule's
  // configure_optimizers); the precision is set on it, and with zero_one_enabled it becomes a
  // Zero1Optimizer over its groups running its elementwise rule (optim/elementwise.h).
  // ConfigError naming the values for impossible settings (ZeRO-1 over an optimizer without an
  // elementwise rule, parameters that are not the model's).
  // `sync` overlap lets the DP buckets go out during backward where the model allows it; at_step
  // reduces them in the step only, so any number of backward passes accumulate before a step
  // without no_sync() (manual optimization, trainer/manual.h).
  NxDOptimizer(const NxDConfig& cfg, NxDModel& model, std::unique_ptr<optim::Optimizer> inner,
               optim::GradSyncMode sync = optim::GradSyncMode::overlap);
  ~NxDOptimizer();

  void step();
  // The same, unless the gradient norm or `loss` is not finite: then nothing is updated (every
  // rank alike: both are global values) and it returns false.
  bool step_if_finite(double loss);
  // Reduces the gradients now (SP sums, the DP reduction) and clips their global norm to
  // max_norm (0: measures it only); returns the norm before clipping. The next step() or
  // step_if_finite() updates from these gradients without reducing or clipping them again
  // (Lightning's clip_gradients in manual optimization).
  double clip_grad_norm(double max_norm);
  void zero_grad() { inner_->zero_grad(/*set_to_none=*/true); }
  // The global norm of the last step's gradients before clipping; nullopt before the first step
  // (NxD's optimizer.grad_norm is None then).
  std::optional<double> grad_norm() const { return grad_norm_; }
  void set_lr(double lr) { inner_->set_lr(lr); }
  optim::Optimizer& inner() { return *inner_; }
  // Gradient accumulation: backward passes under no_sync() do not launch DP reductions.
  optim::GradSync::NoSync no_sync() { return sync().no_sync(); }
  optim::GradSync& sync() { return zero1_ ? zero1_->grad_sync() : *sync_; }
  bool zero1() const { return zero1_ != nullptr; }

 private:
  void reduce();                 // SP sums, the DP reduction (ZeRO-1's in clip())
  double clip(double max_norm);  // grad_norm_, clipped to max_norm (0: not clipped)
  void reduce_and_clip_once();   // with the config's clipping, unless clip_grad_norm did it
  NxDConfig cfg_;
  NxDModel& model_;
  std::shared_ptr<NxDModel> owned_;  // the wrapper made for a bare Module
  std::unique_ptr<optim::Optimizer> inner_;
  optim::Zero1Optimizer* zero1_ = nullptr;
  std::unique_ptr<optim::GradSync> sync_;
  // Expert parallelism: the MoE experts' weights, averaged over the expert-data-parallel group
  // (their gradients are already scaled by 1/EP in backward; layers/moe/moe.h).
  std::unique_ptr<optim::GradSync> expert_sync_;
  std::vector<optim::NormParam> norm_params_;
  optim::NormGroups groups_;
  bool sp_sums_ = false;
  std::optional<double> grad_norm_;
  bool reduced_ = false;  // this step's gradients are reduced (clip_grad_norm)

  // keeps the non-owning wrapper of a plain module (initialize_parallel_optimizer(cfg, Module&))
  void keep(std::shared_ptr<NxDModel> wrapper) { owned_ = std::move(wrapper); }
  friend std::unique_ptr<NxDOptimizer> initialize_parallel_optimizer(const NxDConfig&, Module&,
                                                                     std::vector<optim::ParamGroup>,
                                                                     OptimizerOptions);
  friend std::unique_ptr<NxDOptimizer> initialize_parallel_optimizer(const NxDConfig&, Module&,
                                                                     std::vector<optim::ParamGroup>,
                                                                     const OptimizerFactory&);
};

// NxD's initialize_parallel_optimizer: the optimizer of `options`' kind (AdamW, SGD or Lion) over
// `groups` of the model's local parameters, with the config's DP reduction or ZeRO-1, clipping
// and precision.
std::unique_ptr<NxDOptimizer> initialize_parallel_optimizer(const NxDConfig& cfg, NxDModel& model,
                                                            std::vector<optim::ParamGroup> groups,
                                                            OptimizerOptions options);
// NxD's optimizer_class form: any optimizer `make` builds over `groups` (ZeRO-1 needs its
// elementwise rule: an optim::ElementwiseOptimizer, say).
std::unique_ptr<NxDOptimizer> initialize_parallel_optimizer(const NxDConfig& cfg, NxDModel& model,
                                                            std::vector<optim::ParamGroup> groups,
                                                            const OptimizerFactory& make);
// The same two for a plain module (not built by initialize_parallel_model).
std::unique_ptr<NxDOptimizer> initialize_parallel_optimizer(const NxDConfig& cfg, Module& model,
                                                            std::vector<optim::ParamGroup> groups,
                                                            OptimizerOptions options);
std::unique_ptr<NxDOptimizer> initialize_parallel_optimizer(const NxDConfig& cfg, Module& model,
                                                            std::vector<optim::ParamGroup> groups,
                                                            const OptimizerFactory& make);

}  // namespace nxd::api

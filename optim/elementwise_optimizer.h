#pragma once
// ElementwiseOptimizer: an optimizer given by its elementwise rule (optim/elementwise.h). A user's
// optimizer derives from it and passes the rule; it gets the unsharded step (f32 and bf16
// parameters, master weights and stochastic rounding as AdamW), ZeRO-1 (NxDOptimizer shards any
// rule over DP), and checkpoints of its state (tensors "<param>.<state>", "<param>.step") that
// reshard as AdamW's.
//
// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"; lion-pytorch's update
// order), per element, with the group's lr and weight decay:
//   p *= 1 - lr * wd
//   p -= lr * sign(beta1 * m + (1 - beta1) * g)          (sign(0) = 0)
//   m = beta2 * m + (1 - beta2) * g
// State: "<name>.exp_avg" and "<name>.step". It keeps one moment where AdamW keeps two: half of
// AdamW's optimizer state (a quarter with ZeRO-1 at DP 2), and its update is elementwise, so
// ZeRO-1 shards it as AdamW. (Adafactor saves more memory but factors its second moment over rows
// and columns: not elementwise, so not shardable this way.)
#include <vector>

#include "nxd/optim/optimizer.h"

namespace nxd::optim {

class ElementwiseOptimizer : public Optimizer {
 public:
  // InvalidArgument naming the parameter for one that is not f32 or bf16, and for a rule with
  // more than kMaxElementwiseState state tensors or no update.
  ElementwiseOptimizer(std::vector<ParamGroup> groups, ElementwiseRule rule,
                       PrecisionOptions precision = {});
  void step() override;
  std::optional<ElementwiseRule> elementwise_rule() const override { return rule_; }
  std::vector<std::pair<std::string, double>> hyperparameters() const override {
    return rule_.hyperparameters;
  }

 private:
  ElementwiseRule rule_;
  struct Slot {
    std::vector<Tensor> state;
    Tensor step;
  };
  std::vector<std::vector<Slot>> slots_;  // [group][param]
};

struct LionOptions {
  double beta1 = 0.9;
  double beta2 = 0.99;
  PrecisionOptions precision;
};

class Lion : public ElementwiseOptimizer {
 public:
  Lion(std::vector<ParamGroup> groups, LionOptions opts = {});
  const LionOptions& options() const { return opts_; }
  void set_precision(const PrecisionOptions& p) override;

 private:
  LionOptions opts_;
};

// Lion's rule (what Lion runs; ZeRO-1 and offline resharding build it from the options).
ElementwiseRule lion_rule(const LionOptions& opts);

}  // namespace nxd::optim

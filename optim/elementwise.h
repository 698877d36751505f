#pragma once
// The elementwise form of an optimizer: what ZeRO-1 (optim/zero1.h) needs to shard an optimizer's
// state over data-parallel ranks. An optimizer whose update of one element reads only that
// element's parameter value, gradient and state (AdamW, SGD, Lion; not Adafactor, whose second
// moment is factored over rows and columns) describes the update as an ElementwiseRule: its
// per-element state tensors by name and a function updating any range of elements. Any split of
// a parameter's elements then gives bitwise the update of the whole, so ZeRO-1 runs the rule on
// each rank's shard and all-gathers the parameters. The unsharded optimizer runs the same rule,
// which makes the sharded and unsharded updates bitwise equal.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace nxd::optim {

// Per-element state tensors a rule may keep (exp_avg and exp_avg_sq for AdamW).
inline constexpr int kMaxElementwiseState = 4;

// n elements of one parameter at its update number t (1 for the first), with its group's lr and
// weight decay: the working values p (f32: the parameter itself, or the master / a copy of a bf16
// parameter), the gradient g (f32) and the state arrays in ElementwiseRule::state order.
struct ElementwiseStep {
  float* p;
  const float* g;
  float* state[kMaxElementwiseState];
  int64_t n;
  double lr, weight_decay;
  int64_t t;
};

struct ElementwiseRule {
  const char* kind = "";  // the optimizer's kind (Optimizer::kind(): checkpoints name it)
  // Per-element f32 state, zeros before the first update, e.g. {"exp_avg", "exp_avg_sq"}; the
  // optimizer's state tensors are "<param>.<name>" (and "<param>.step", the update count).
  std::vector<std::string> state;
  std::function<void(const ElementwiseStep&)> update;
  // The optimizer's hyperparameters by name (checkpoint metadata: "beta1", "eps", ...).
  std::vector<std::pair<std::string, double>> hyperparameters;
  int64_t cost = 8;  // relative cost of one element (the compute pool's work split)
};

}  // namespace nxd::optim

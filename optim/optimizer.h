#pragma once
// Optimizers over named parameters: SGD (momentum, dampening, Nesterov, weight decay) and AdamW,
// with PyTorch's exact update rules (torch.optim.SGD / torch.optim.AdamW, single-tensor path).
//
// Parameters are grouped (ParamGroup), each group with its own lr and weight decay;
// default_param_groups() is NxD's grouping: no weight decay for biases and norm weights.
// The state of every parameter lives in named tensors ("<param>.exp_avg", "<param>.exp_avg_sq",
// "<param>.step", "<param>.momentum_buffer") allocated at construction, so a checkpoint can read
// state_tensors() and copy saved values back into the same handles before the first step.
//
// Precision: the update is one vectorizable pass over contiguous f32 (or f64) parameter, grad
// and state; scalars are computed in double and rounded to the parameter type once, as torch
// does. bf16 parameters (mixed precision) are updated in f32 with f32 state, on an f32 master copy
// or on their own value, rounded to nearest or stochastically (optim/precision.h); f32 gradients
// of bf16 parameters (f32 gradient accumulation) are used as they are.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nxd/optim/elementwise.h"
#include "nxd/optim/precision.h"
#include "nxd/runtime/tensor.h"

namespace nxd::optim {

struct NamedParam {
  std::string name;
  Tensor param;  // a leaf; its .grad() is read by step()
};

struct ParamGroup {
  std::string name;  // "decay", "no_decay", or any label
  std::vector<NamedParam> params;
  double lr = 1e-3;
  double weight_decay = 0.0;
  // The schedule sets lr = schedule_lr * lr_scale for every group (1 = follow the schedule).
  double lr_scale = 1.0;
};

// NxD's default grouping (NeuronLTModule.configure_optimizers): parameters whose name contains
// "bias" or "norm" (e.g. "layers.0.input_layernorm.weight", "lm_head.bias") get weight decay 0,
// all others `weight_decay`. Parameters that require no gradient (frozen: LoRA's base weights)
// are left out. Empty groups are dropped; order within a group is input order.
// With do_layer_norm_weight_decay (NxD Training's model.do_layer_norm_weight_decay) only biases
// are exempt: norm weights decay too.
struct WeightDecayOptions {
  bool do_layer_norm_weight_decay = false;
};
std::vector<ParamGroup> default_param_groups(const std::vector<NamedParam>& params, double lr,
                                             double weight_decay, WeightDecayOptions opts = {});
bool is_no_decay_param(const std::string& name, WeightDecayOptions opts = {});

// One parameter's optimizer state as far as this rank holds it (a sharded optimizer, ZeRO-1):
// elements [lo, hi) of the flattened (TP-local) parameter.
struct StateShard {
  std::string param;       // the parameter's name
  Shape shape;             // the parameter's (TP-local) shape
  int64_t lo = 0, hi = 0;  // the elements held here; lo == hi: none
  int64_t step = 0;        // the parameter's step count (the same on every rank)
  // The state of those elements by AdamW's state names ("exp_avg", "exp_avg_sq", and "master"
  // with master weights), each f32 [hi - lo].
  std::vector<std::pair<std::string, Tensor>> tensors;
};

class Optimizer {
 public:
  // Parameters must be contiguous host tensors of f32, f64 or bf16 (InvalidArgument naming the
  // parameter otherwise).
  Optimizer(std::vector<ParamGroup> groups, const char* kind, PrecisionOptions precision = {});
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient (parameters without .grad are skipped
  // and their step count does not advance, as in torch). Runs with grad mode off.
  virtual void step() = 0;
  // Zeroes every gradient in place (set_to_none: drops them instead).
  void zero_grad(bool set_to_none = false);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Sets every group's lr to lr * group.lr_scale (what an LR schedule calls each step).
  void set_lr(double lr);
  // All parameters, in group order.
  std::vector<NamedParam> named_parameters() const;

  // The optimizer state as named tensors, in a fixed order (parameters in group order, then
  // the state names of each). The handles are the live state: copy_() into them to restore.
  const std::vector<std::pair<std::string, Tensor>>& state_tensors() const { return state_; }
  // Number of step() calls so far.
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }

  // Sharded state (ZeRO-1): an optimizer that holds only a part of every parameter's state on
  // this rank says so (state_is_sharded; its state_tensors() are then empty) and exposes that part
  // as it is: sharded_state() gives one record per parameter (every parameter, in a fixed order;
  // lo == hi where this rank holds none of it) whose tensors are views of the live state, valid
  // until the state changes. load_sharded_state() copies records of the same parameters and
  // ranges back into the live state: the tensors they list (others keep their values) and the
  // step when it is >= 0. Unsharded optimizers: false, empty, and InvalidArgument.
  virtual bool state_is_sharded() const { return false; }
  virtual std::vector<StateShard> sharded_state() const { return {}; }
  virtual void load_sharded_state(const std::vector<StateShard>& records) {
    NXD_CHECK(records.empty(), "[", kind_, "] load_sharded_state: the state is not sharded (",
              records.size(), " records given)");
  }
  const char* kind() const { return kind_; }
  // The update as an elementwise rule (optim/elementwise.h): what ZeRO-1 shards. nullopt: the
  // update is not elementwise (ZeRO-1 refuses the optimizer).
  virtual std::optional<ElementwiseRule> elementwise_rule() const { return std::nullopt; }
  // The hyperparameters a checkpoint records besides the groups' lr and weight decay.
  virtual std::vector<std::pair<std::string, double>> hyperparameters() const { return {}; }
  // Bytes of optimizer state this rank holds (state tensors, master weights).
  virtual int64_t state_bytes() const;

  // How bf16 parameters are updated (optim/precision.h). Set before the first step; with
  // master_weights each bf16 parameter gets its f32 copy ("<name>.master") from its current value.
  virtual void set_precision(const PrecisionOptions& p);
  const PrecisionOptions& precision() const { return precision_; }
  // The f32 master copy of a bf16 parameter (undefined without master weights or for f32/f64).
  Tensor master(const NamedParam& p) const;

 protected:
  // What a state tensor holds: a value per element of the parameter (zeros like it; f32 for a
  // bf16 parameter), or the parameter's step count (a scalar i64).
  enum class StateKind { per_element, step_count };
  // Adds the named state tensor "<p.name>.<what>" for parameter `p`, zeroed.
  Tensor add_state(const NamedParam& p, const std::string& what, StateKind kind);

  // An update of a bf16 parameter runs on f32 values: its master copy, or a copy of its value
  // that write_back() rounds into the parameter. For f32/f64 parameters: the parameter itself.
  struct Working {
    Tensor values;    // f32 (bf16 parameters) or the parameter (f32/f64)
    Tensor round_to;  // the bf16 parameter to round `values` into after the update, or undefined
    RoundingNoise noise;
    bool stochastic = false;
    // Rounds elements [b, e) of values into round_to (nothing for f32/f64 parameters).
    void write_back(int64_t b, int64_t e) const;
  };
  // `t` is the parameter's optimizer step (1 for the first), for the rounding noise.
  Working working(const NamedParam& p, int64_t t) const;
  // The gradient for the update: contiguous, the parameter's dtype for f32/f64 parameters, f32
  // for bf16 ones; undefined if none. InvalidArgument on a shape mismatch.
  Tensor update_grad(const NamedParam& p) const;
  // The parameter walk of every step(): calls fn(group, gi, pi, param, grad) for each parameter
  // that has a gradient (update_grad), in group order; gi and pi index groups_ and its params.
  template <class Fn>
  void for_each_with_grad(Fn&& fn) const {
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      const ParamGroup& grp = groups_[gi];
      for (size_t pi = 0; pi < grp.params.size(); ++pi) {
        const NamedParam& np = grp.params[pi];
        Tensor g = update_grad(np);
        if (g.defined()) fn(grp, gi, pi, np, g);
      }
    }
  }

  std::vector<ParamGroup> groups_;
  std::vector<std::pair<std::string, Tensor>> state_;
  int64_t steps_ = 0;
  const char* kind_;
  PrecisionOptions precision_;
};

struct SGDOptions {
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0 (torch's rule)
  PrecisionOptions precision;
};

// torch.optim.SGD:  g = grad + wd * p;  with momentum: buf = g (first step) else
// buf = momentum * buf + (1 - dampening) * g;  g = nesterov ? g + momentum * buf : buf;
// p -= lr * g.   State: "<name>.momentum_buffer", "<name>.step" (momentum > 0 only), and
// "<name>.master" for a bf16 parameter with master weights.
class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, SGDOptions opts = {});
  void step() override;
  void set_precision(const PrecisionOptions& p) override;
  const SGDOptions& options() const { return opts_; }
  std::optional<ElementwiseRule> elementwise_rule() const override;
  std::vector<std::pair<std::string, double>> hyperparameters() const override;

 private:
  SGDOptions opts_;
  struct Slot {
    Tensor buf, step;
  };
  std::vector<std::vector<Slot>> slots_;  // [group][param]
};

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  PrecisionOptions precision;
  // The state (exp_avg, exp_avg_sq, step) is allocated at the first step() instead of at
  // construction: for an AdamW that only carries the options and groups to an optimizer that
  // replaces it (ZeRO-1 in NxDOptimizer), so its full-size state never exists. state_tensors()
  // is empty until then (a checkpoint cannot be loaded into it before its first step).
  bool defer_state = false;
};

// torch.optim.AdamW (decoupled weight decay, bias correction, eps outside the sqrt), per
// parameter with its own step count t:
//   p *= 1 - lr * wd
//   m = b1 * m + (1 - b1) * g;   v = b2 * v + (1 - b2) * g * g
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// State: "<name>.exp_avg", "<name>.exp_avg_sq", "<name>.step" (i64 scalar), and "<name>.master"
// for a bf16 parameter with master weights.
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamWOptions opts = {});
  void step() override;
  void set_precision(const PrecisionOptions& p) override;
  const AdamWOptions& options() const { return opts_; }
  std::optional<ElementwiseRule> elementwise_rule() const override;
  std::vector<std::pair<std::string, double>> hyperparameters() const override;

 private:
  AdamWOptions opts_;
  struct Slot {
    Tensor m, v, step;
  };
  std::vector<std::vector<Slot>> slots_;
  void allocate_state();
};

// AdamW's update as an elementwise rule (what AdamW::elementwise_rule returns).
ElementwiseRule adamw_rule(const AdamWOptions& opts);

// ---- gradient norm and clipping ----
// norm_type 2 (L2 over all gradient elements of all parameters, as one vector) or
// kInfNorm (max |g|). Parameters without a gradient are skipped. Accumulates in double.
inline constexpr double kInfNorm = -1.0;
double grad_norm(const std::vector<Tensor>& params, double norm_type = 2.0);
// The statistic grad_norm adds up per gradient (parallel_grad_norm too): the sum of squares of a
// floating tensor's elements in double (norm_type 2), or the largest |x| (kInfNorm). Runs on the
// compute pool in an order fixed by the element count, so it is the same for any thread count.
enum class GradStat { sum_of_squares, max_abs };
GradStat grad_stat_of_norm(double norm_type);  // kInfNorm: max_abs, else sum_of_squares
double grad_stat(const Tensor& g, GradStat stat);
// Multiplies every gradient by `coef` in place.
void scale_grads(const std::vector<Tensor>& params, double coef);
// torch.nn.utils.clip_grad_norm_: total = grad_norm(params); if max_norm / (total + 1e-6) < 1
// the gradients are scaled by that factor. Returns the total norm before clipping.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

std::vector<Tensor> params_of(const std::vector<NamedParam>& named);

}  // namespace nxd::optim

#pragma once
// Module: the container of parameters, buffers and child modules that every layer and model is.
//
// Names are hierarchical: a parameter "weight" of the child "q_proj" of the child "self_attn" of
// child "3" of the ModuleList "layers" is "layers.3.self_attn.q_proj.weight". Everything is listed
// in registration order (a module's parameters, then its buffers, then its children, recursively),
// as in PyTorch, so state dicts line up with Hugging Face checkpoints.
//
// Initialization is by name: every parameter carries a ParamInit rule, and init_parameters(seed)
// fills each one from the counter-based stream RngStream{seed, stream_id(full name)}. A value
// therefore depends only on (seed, full parameter name, element index in the full tensor), never
// on construction order; a tensor-parallel shard sets ParamInit::region and gets exactly its slice
// of the weight a single rank would create.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "nxd/runtime/init.h"
#include "nxd/runtime/tensor.h"

namespace nxd {

class StepMetrics;  // layers/step_hooks.h
class ParamUnit;    // layers/param_unit.h

// How a parameter is initialized by Module::init_parameters.
struct ParamInit {
  enum class Kind { none, zeros, ones, constant, normal, uniform, fan_in_uniform };
  Kind kind = Kind::none;  // none: left as is
  double a = 0.0;          // normal: mean; uniform: lo; constant: value; fan_in_uniform: scale
  double b = 0.0;          // normal: std; uniform: hi
  // Set when the tensor is a block of a larger logical tensor (a tensor-parallel shard): values
  // are those of the full tensor at this block.
  std::optional<init::Region> region;

  static ParamInit none() { return {}; }
  static ParamInit zeros() { return {Kind::zeros}; }
  static ParamInit ones() { return {Kind::ones}; }
  static ParamInit constant(double v) { return {Kind::constant, v}; }
  static ParamInit normal(double std, double mean = 0.0) { return {Kind::normal, mean, std}; }
  static ParamInit uniform(double lo, double hi) { return {Kind::uniform, lo, hi}; }
  // PyTorch's torch.nn.Linear default, which NxD's parallel layers keep: weights
  // kaiming_uniform_(a=sqrt(5)) and biases alike, i.e. uniform(-scale/sqrt(fan_in),
  // +scale/sqrt(fan_in)) with scale 1. fan_in is the layer's full input size (never a TP
  // shard's): the layer that registers the parameter turns the rule into a uniform one with
  // for_fan_in(); init_parameters refuses an unresolved one.
  static ParamInit fan_in_uniform(double scale = 1.0) { return {Kind::fan_in_uniform, scale}; }
  // fan_in_uniform -> uniform(+-a/sqrt(fan_in)); any other rule is returned unchanged.
  ParamInit for_fan_in(int64_t fan_in) const;
  // Fills host tensor `t` by this rule from RngStream{seed, stream_id(full_name)} (full_name: the
  // parameter's hierarchical name); `none` leaves it as it is. InvalidArgument naming the
  // parameter for an unresolved fan_in_uniform rule.
  void apply(const Tensor& t, uint64_t seed, const std::string& full_name) const;
};

// Where new parameters live.
struct ParamOptions {
  DType dtype = DType::f32;
  Device device = Device::host;  // meta: shapes only (the planner)
};

// An ordered name -> tensor map (a model's state dict).
class StateDict {
 public:
  using Item = std::pair<std::string, Tensor>;
  // Appends; throws InvalidArgument on a duplicate name.
  void insert(const std::string& name, const Tensor& t);
  // Replaces the tensor of an existing name, or appends.
  void set(const std::string& name, const Tensor& t);
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const Tensor* find(const std::string& name) const;
  const Tensor& at(const std::string& name) const;  // throws InvalidArgument naming the key
  bool erase(const std::string& name);
  std::vector<std::string> keys() const;
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  std::vector<Item>::const_iterator begin() const { return items_.begin(); }
  std::vector<Item>::const_iterator end() const { return items_.end(); }
  const std::vector<Item>& items() const { return items_; }

 private:
  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> index_;
};

// What load_state_dict(strict=false) did not match.
struct LoadResult {
  std::vector<std::string> missing_keys;     // in the model, not in the dict (left unchanged)
  std::vector<std::string> unexpected_keys;  // in the dict, not in the model (ignored)
  bool ok() const { return missing_keys.empty() && unexpected_keys.empty(); }
};

class Module {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }

  // ---- registration (names are single components: no dots, unique within the module) ----
  // Marks `t` as requiring grad; returns the registered handle.
  const Tensor& register_parameter(const std::string& name, Tensor t,
                                   ParamInit init = ParamInit::none());
  // Buffers are state that is not trained (running statistics, masks). Non-persistent buffers are
  // left out of the state dict.
  const Tensor& register_buffer(const std::string& name, Tensor t, bool persistent = true);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

  // ---- access (hierarchical names, registration order) ----
  // Parameters, each tensor once (a tensor registered twice is listed under its first name).
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const {
    return children_;
  }
  // This module ("") and every descendant, pre-order.
  std::vector<std::pair<std::string, Module*>> named_modules();
  // The parameter with this hierarchical name; throws InvalidArgument naming it if absent.
  Tensor get_parameter(const std::string& name) const;
  // The init rule of a parameter (hierarchical name).
  const ParamInit& param_init(const std::string& name) const;
  std::shared_ptr<Module> get_child(const std::string& name) const;  // direct child or throws
  int64_t num_parameters() const;  // elements over named_parameters()

  // ---- state ----
  // Parameters and persistent buffers by hierarchical name. The tensors are the module's own
  // (detached handles sharing storage): clone() them to snapshot.
  StateDict state_dict() const;
  // Copies values into the module's tensors (no graph is recorded). Every key present in both must
  // match in shape and dtype; a mismatch throws ShapeError (resp. InvalidArgument) naming the key
  // and both shapes/dtypes, before anything is copied. strict: missing or unexpected keys throw,
  // listing all of them; otherwise they are returned.
  LoadResult load_state_dict(const StateDict& dict, bool strict = true);

  // Fills every parameter (recursively) by its rule from RngStream{seed, stream_id(prefix+name)}.
  // Meta parameters are skipped.
  void init_parameters(uint64_t seed, const std::string& prefix = "");

  // ---- meta-device initialization (NxD's model_init_config.meta_device_init) and dtype ----
  // Fills one materialized tensor: `name` is its hierarchical name (prefix included).
  using TensorInitFn = std::function<void(const std::string& name, const Tensor& t)>;
  // Gives every meta parameter and buffer host storage of its shape and dtype, one tensor at a
  // time (so a rank never holds more than its own shards), and fills it: with `init` when given,
  // else a parameter by its registered rule from `seed` — exactly the values a host build
  // initialized with init_parameters(seed, prefix) holds — and a buffer with zeros. The tensors
  // keep their identity (every handle on them, the layers' own included, sees the new storage).
  // Host tensors are left as they are. Returns the bytes allocated.
  int64_t materialize(uint64_t seed, const TensorInitFn& init = nullptr,
                      const std::string& prefix = "");
  // Converts every floating parameter and buffer to `dtype` in place (bf16 rounds to nearest
  // even), keeping the tensors' identity; their .grad and gradient buffers are dropped. Integer
  // tensors are left as they are. Call it before building optimizers or gradient buckets over the
  // model (they hold the parameters' dtype).
  void to_dtype(DType dtype);

  // ---- mode and gradients ----
  virtual void train(bool on = true);  // recursive
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Drops (set_to_none) or zeroes the .grad of every parameter.
  void zero_grad(bool set_to_none = true);
  // Adds the figures this module reports for the step just run (layers/step_hooks.h; e.g. a
  // mixture of experts' auxiliary loss and expert loads) to `out`. A model's root module reports
  // for its whole tree; the default reports none.
  virtual void step_metrics(StepMetrics& out) { (void)out; }

  // ---- activation checkpointing of selected instances (layers/activation_checkpoint.h) ----
  // Whether this instance's forward recomputes its activations in backward; set by
  // apply_activation_checkpoint, honoured by forwards that run through checkpointed_forward.
  bool recomputes_activations() const { return recompute_ != Recompute::off; }
  void set_recompute_activations(bool on) {
    recompute_ = on ? Recompute::selected : Recompute::off;
  }
  // Whether a forward of this instance ran through checkpointed_forward since it was selected.
  bool ran_checkpointed_forward() const { return recompute_ == Recompute::ran; }
  void mark_checkpointed_forward() const {
    if (recompute_ != Recompute::off) recompute_ = Recompute::ran;
  }

  // ---- ZeRO-3 (layers/param_unit.h): the unit that gathers this module's parameters ----
  const std::shared_ptr<ParamUnit>& param_unit() const { return param_unit_; }
  void set_param_unit(std::shared_ptr<ParamUnit> u) { param_unit_ = std::move(u); }

 protected:
  void add_child(const std::string& name, std::shared_ptr<Module> m);

 private:
  struct Param {
    std::string name;
    Tensor tensor;
    ParamInit init;
  };
  struct Buffer {
    std::string name;
    Tensor tensor;
    bool persistent;
  };
  void check_new_name(const std::string& name, const char* what) const;
  template <class F>
  void visit(const std::string& prefix, F&& f) const;  // f(prefix, module)
  const Param* find_param(const std::string& name) const;

  std::string type_name_;
  bool training_ = true;
  enum class Recompute { off, selected, ran };
  mutable Recompute recompute_ = Recompute::off;
  std::shared_ptr<ParamUnit> param_unit_;
  std::vector<Param> params_;
  std::vector<Buffer> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

// A list of modules named "0", "1", ... (the decoder layers); a list starting at `first_index`
// names its items first_index, first_index + 1, ... (a pipeline stage's share of the layers keeps
// the whole model's names) while operator[] still counts from 0.
class ModuleList : public Module {
 public:
  explicit ModuleList(int64_t first_index = 0) : Module("ModuleList"), first_(first_index) {}
  int64_t first_index() const { return first_; }
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    add_child(std::to_string(first_ + static_cast<int64_t>(items_.size())), m);
    items_.push_back(m);
    return m;
  }
  size_t size() const { return items_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const { return items_.at(i); }
  template <class M>
  std::shared_ptr<M> at(size_t i) const {
    return std::dynamic_pointer_cast<M>(items_.at(i));
  }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  int64_t first_ = 0;
  std::vector<std::shared_ptr<Module>> items_;
};

}  // namespace nxd

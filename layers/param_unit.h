#pragma once
// ZeRO-3 units (PyTorch FSDP's wrapped modules with their FlatParameter): a module whose
// parameters live sharded over the data-parallel ranks between uses and are gathered around its
// forward and its backward. The optimizer that shards them (optim/zero1.h, stage three) gives
// each unit module a ParamUnit (Module::set_param_unit); the model's loop runs the module's
// forward through run_param_unit, which
//   - gathers the parameters before the forward (ParamUnit::gather, forward pass),
//   - releases them after it when reshard_after_forward() (FSDP's default) or when no backward
//     will follow (grad mode off, or nothing requires grad),
//   - records an identity on the output whose backward gathers them again before the module's
//     backward starts (the engine runs it first: every node of the module depends on it), and
//   - records an identity on the input whose backward releases them once the module's backward
//     is done (it runs after every node that consumed the input).
// The graph's saved views of the parameters share the parameters' Storage: releasing frees its
// block and gathering gives the same Storage a new one (runtime/allocator.h: release_data,
// reallocate), so the saved views see the gathered values again without being rebound and keep
// no full-size memory alive in between. Activation checkpointing composes: the recomputation runs
// inside the module's backward, after the gather.
#include <functional>
#include <memory>
#include <vector>

#include "nxd/layers/module.h"

namespace nxd {

// outside: around anything else that reads or writes the weights (checkpoints, generation): no
// prefetch, and release takes this rank's shards back from the full values.
enum class UnitPass { forward, backward, outside };

class ParamUnit {
 public:
  virtual ~ParamUnit() = default;
  // The unit's full parameters present (blocking; a no-op when they are).
  virtual void gather(UnitPass pass) = 0;
  // Their full-size memory freed (a no-op when it is).
  virtual void release(UnitPass pass) = 0;
  virtual bool reshard_after_forward() const = 0;
};

// RAII (FSDP's summon_full_params): every unit in the modules' trees gathered (UnitPass::outside)
// for its lifetime, then released, each rank's shards taken from the full values (written ones
// included). Collective over the units' DP group; nothing without units.
class WholeParameters {
 public:
  explicit WholeParameters(const std::vector<const Module*>& modules);
  ~WholeParameters();
  WholeParameters(const WholeParameters&) = delete;
  WholeParameters& operator=(const WholeParameters&) = delete;

 private:
  std::vector<std::shared_ptr<ParamUnit>> units_;
};

// A model sharded by an optimizer gone since (a second fit on the same modules) made whole again:
// every unit in the trees gathered and removed from its module. Collective like WholeParameters;
// returns the units removed.
int remove_param_units(const std::vector<Module*>& modules);

// `body(x)` (the module's forward) inside `m`'s unit as described above; a plain call when `m`
// has no unit.
Tensor run_param_unit(const Module& m, const Tensor& x,
                      const std::function<Tensor(const Tensor&)>& body);

}  // namespace nxd

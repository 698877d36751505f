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
// inside the module's backward, after the gather. The model's own parameters outside its blocks
// form the root unit (RootUnitScope below).
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
  // Whether the full parameters are present (or on their way).
  virtual bool gathered() const = 0;
  // Whether they were gathered outside a pass (WholeParameters, a checkpoint's walk) and not
  // released since: a forward without a graph then leaves them gathered.
  virtual bool held_whole() const = 0;
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

// `body()` (the forward of `m`, e.g. a token embedding's lookup) inside `m`'s unit when the forward
// alone reads its weights (a lookup's backward is a scatter-add into the gradient: it reads no
// weight): gathered before, released right after (unless held whole outside a pass), and not
// gathered again for the backward. A plain call when `m` has no unit. ZeRO-3 makes the embedding
// such a unit (a "lookup unit") so that it is not held from the forward's start to the head's
// backward inside the root unit (docs/design/fsdp.md).
Tensor run_lookup_unit(const Module& m, const std::function<Tensor()>& body);

// FSDP's root unit: the parameters of a model that are in no unit of its blocks (a decoder LM's
// final norm and output head, and its embedding when that is a tied head's weight; an untied
// embedding is a lookup unit of its own, above), sharded like a unit whose ParamUnit is set on the
// model module itself. The model opens a RootUnitScope around each entry point of its forward; the
// outermost gathers the root (UnitPass::forward) unless it is gathered already (WholeParameters).
// As FSDP does for the root, a forward followed by a backward does not release it (the head's
// backward comes right away): the model passes the input of the root's last reader (the final norm,
// whose output the head reads) through release_root_after_backward, an identity whose backward
// releases the root once the backwards of every forward recorded so are past it (the layers'
// backward and the embedding's, which reads no weight, need none of the root). Without a backward
// to follow (grad mode off when the outermost scope closes, and no release pending) the scope
// releases the root it gathered. A root left gathered in grad mode (a forward whose graph was
// dropped) goes at the optimizer's step. Nothing without a unit.
struct RootUnitUses {
  int open = 0;  // scopes open
  // releases recorded by release_root_after_backward whose backward has not run (and whose graph
  // still exists)
  std::shared_ptr<int> pending = std::make_shared<int>(0);
};

class RootUnitScope {
 public:
  RootUnitScope(const Module& root, RootUnitUses& uses);
  ~RootUnitScope();
  RootUnitScope(const RootUnitScope&) = delete;
  RootUnitScope& operator=(const RootUnitScope&) = delete;

 private:
  std::shared_ptr<ParamUnit> unit_;
  RootUnitUses& uses_;
  bool gathered_here_ = false;
};

// x with the identity described above when grad mode is on, x requires grad and `root` has a unit;
// else x.
Tensor release_root_after_backward(const Module& root, RootUnitUses& uses, const Tensor& x);

}  // namespace nxd

#include "nxd/layers/param_unit.h"

#include "nxd/autograd/function.h"

namespace nxd {

namespace {
std::vector<Tensor> identity(const std::vector<Tensor>& v) {
  return v;
}
}  // namespace

WholeParameters::WholeParameters(const std::vector<const Module*>& modules) {
  for (const Module* m : modules)
    if (m)
      for (auto& [name, sub] : const_cast<Module*>(m)->named_modules())
        if (sub->param_unit()) units_.push_back(sub->param_unit());
  for (auto& u : units_) u->gather(UnitPass::outside);
}

WholeParameters::~WholeParameters() {
  for (auto& u : units_) u->release(UnitPass::outside);
}

int remove_param_units(const std::vector<Module*>& modules) {
  int n = 0;
  for (Module* m : modules)
    if (m)
      for (auto& [name, sub] : m->named_modules())
        if (auto u = sub->param_unit()) {
          u->gather(UnitPass::outside);
          sub->set_param_unit(nullptr);
          ++n;
        }
  return n;
}

Tensor run_param_unit(const Module& m, const Tensor& x,
                      const std::function<Tensor(const Tensor&)>& body) {
  const std::shared_ptr<ParamUnit>& u = m.param_unit();
  if (!u) return body(x);
  u->gather(UnitPass::forward);
  const bool grad = GradMode::is_enabled();
  Tensor in = x;
  if (grad && x.requires_grad())
    in = autograd::custom("param_unit_release", {x}, identity, [u](const Grads& g) -> Grads {
      u->release(UnitPass::backward);
      return g;
    })[0];
  Tensor y = body(in);
  const bool backward_follows = grad && y.requires_grad();
  // (a unit held whole around a forward without a graph, e.g. generation inside
  // WholeParameters, stays so)
  if (backward_follows ? u->reshard_after_forward() : !u->held_whole())
    u->release(UnitPass::forward);
  if (!backward_follows) return y;
  return autograd::custom("param_unit_gather", {y}, identity, [u](const Grads& g) -> Grads {
    u->gather(UnitPass::backward);
    return g;
  })[0];
}

Tensor run_lookup_unit(const Module& m, const std::function<Tensor()>& body) {
  const std::shared_ptr<ParamUnit>& u = m.param_unit();
  if (!u) return body();
  u->gather(UnitPass::forward);
  Tensor y = body();
  if (!u->held_whole()) u->release(UnitPass::forward);
  return y;
}

namespace {

// One release recorded by release_root_after_backward: counted in `pending` until its backward
// runs or its graph is freed without one.
struct RootRelease {
  std::shared_ptr<ParamUnit> unit;
  std::shared_ptr<int> pending;
  bool done = false;
  void run() {
    if (done) return;
    done = true;
    if (--*pending == 0) unit->release(UnitPass::backward);
  }
  ~RootRelease() {
    if (!done) --*pending;
  }
};

}  // namespace

RootUnitScope::RootUnitScope(const Module& root, RootUnitUses& uses)
    : unit_(root.param_unit()), uses_(uses) {
  if (!unit_ || uses_.open++ > 0) return;
  gathered_here_ = !unit_->gathered();
  unit_->gather(UnitPass::forward);
}

RootUnitScope::~RootUnitScope() {
  if (!unit_ || --uses_.open > 0) return;
  if (gathered_here_ && !GradMode::is_enabled() && *uses_.pending == 0)
    unit_->release(UnitPass::forward);
}

Tensor release_root_after_backward(const Module& root, RootUnitUses& uses, const Tensor& x) {
  const std::shared_ptr<ParamUnit>& u = root.param_unit();
  if (!u || !GradMode::is_enabled() || !x.requires_grad()) return x;
  auto r = std::make_shared<RootRelease>();
  r->unit = u;
  r->pending = uses.pending;
  ++*uses.pending;
  return autograd::custom("root_unit_release", {x}, identity, [r](const Grads& g) -> Grads {
    r->run();
    return g;
  })[0];
}

}  // namespace nxd

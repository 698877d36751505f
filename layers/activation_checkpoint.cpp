#include "nxd/layers/activation_checkpoint.h"

#include "nxd/autograd/graph.h"
#include "nxd/runtime/error.h"

namespace nxd {

int apply_activation_checkpoint(Module& model, const std::vector<ModuleClass>& classes) {
  int selected = 0;
  for (const ModuleClass& cls : classes)
    for (auto& [name, m] : require_instances(model, cls, "apply_activation_checkpoint")) {
      if (!m->recomputes_activations()) ++selected;
      m->set_recompute_activations(true);
    }
  return selected;
}

namespace {

bool has_trainable_parameters(const Module& m) {
  for (const Tensor& p : m.parameters())
    if (p.requires_grad()) return true;
  return false;
}

}  // namespace

std::vector<Tensor> checkpointed_forward(const Module& self, const std::vector<Tensor>& inputs,
                                         const autograd::ForwardFn& body) {
  self.mark_checkpointed_forward();
  if (!self.recomputes_activations() || !GradMode::is_enabled()) return body(inputs);
  if (autograd::needs_grad(inputs)) return autograd::recompute(body, inputs);
  if (!has_trainable_parameters(self)) return body(inputs);
  // Only the parameters need gradients: a one-element leaf that requires grad (and gets none)
  // makes the recomputation record its node; the body never sees it.
  std::vector<Tensor> with_anchor = inputs;
  Tensor anchor = zeros({1});
  anchor.set_requires_grad(true);
  with_anchor.push_back(anchor);
  const size_t n = inputs.size();
  return autograd::recompute(
      [body, n](const std::vector<Tensor>& xs) {
        return body(std::vector<Tensor>(xs.begin(), xs.begin() + static_cast<std::ptrdiff_t>(n)));
      },
      with_anchor);
}

Tensor checkpointed_forward(const Module& self, const Tensor& x,
                            const std::function<Tensor(const Tensor&)>& body) {
  return checkpointed_forward(
             self, std::vector<Tensor>{x},
             [body](const std::vector<Tensor>& xs) { return std::vector<Tensor>{body(xs[0])}; })
      .at(0);
}

void check_activation_checkpoint_ran(const std::vector<Module*>& modules,
                                     const std::vector<ModuleClass>& classes) {
  for (const ModuleClass& cls : classes) {
    bool found = false, ran = false;
    std::string first;
    for (Module* model : modules)
      for (auto& [name, m] : instances_of(*model, cls)) {
        if (!m->recomputes_activations()) continue;
        if (!found) first = name.empty() ? "(the model)" : name;
        found = true;
        ran = ran || m->ran_checkpointed_forward();
      }
    NXD_CHECK(!found || ran, "[activation_checkpoint] class ", cls.name, " (e.g. ", first,
              ") ran its forward without checkpointed_forward, so nothing of it is recomputed: "
              "run its forward body through nxd::checkpointed_forward "
              "(layers/activation_checkpoint.h)");
  }
}

}  // namespace nxd

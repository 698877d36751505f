#pragma once
// Activation checkpointing of every instance of a module class (NxD's
// activation_checkpoint_config=<module class>, for any model):
//
//   apply_activation_checkpoint(*model, {ModuleClass::of<MyBlock>()});
//
//   class MyBlock : public Module {
//     Tensor forward(const Tensor& x) const {
//       return checkpointed_forward(*this, x, [this](const Tensor& h) { return body(h); });
//     }
//   };
//
// A selected instance's forward runs under autograd::recompute: only its inputs are kept, its
// intermediate activations are dropped and recomputed in backward, with the RNG replayed, so
// gradients are bitwise those of the plain forward. C++ has no call operator every module goes
// through (PyTorch's nn.Module.__call__, which NxD's checkpoint wrapper replaces): a class takes
// part by running its forward body through checkpointed_forward (a plain call when not selected).
// check_activation_checkpoint_ran refuses a selected class whose forward never did.
#include <functional>
#include <vector>

#include "nxd/autograd/function.h"
#include "nxd/layers/module_class.h"

namespace nxd {

// Selects every instance of each class (pre-order; an instance nested in another selected one is
// recomputed inside its parent's recomputation). Returns the number of instances selected.
// InvalidArgument naming a class that matches no module of `model`.
int apply_activation_checkpoint(Module& model, const std::vector<ModuleClass>& classes);

// Runs `body` (the module's forward) directly, or under autograd::recompute when `self` is
// selected and grad mode is on. `body` runs again in backward: it must not capture locals of the
// caller by reference (capture `this` and values). Inputs that need no gradient (the model's data)
// still get the recomputation when the module has trainable parameters.
Tensor checkpointed_forward(const Module& self, const Tensor& x,
                            const std::function<Tensor(const Tensor&)>& body);
std::vector<Tensor> checkpointed_forward(const Module& self, const std::vector<Tensor>& inputs,
                                         const autograd::ForwardFn& body);

// After a training forward: InvalidArgument naming each class whose selected instances (in
// `modules`) all ran without checkpointed_forward (its forward does not call it, so nothing is
// recomputed). A class with no instance in `modules` is skipped.
void check_activation_checkpoint_ran(const std::vector<Module*>& modules,
                                     const std::vector<ModuleClass>& classes);

}  // namespace nxd

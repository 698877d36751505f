#include "nxd/autograd/function.h"

#include "nxd/runtime/context.h"

namespace nxd::autograd {

static std::vector<Tensor> detached(const std::vector<Tensor>& xs) {
  std::vector<Tensor> r;
  r.reserve(xs.size());
  for (const auto& x : xs) r.push_back(x.defined() ? x.detach() : Tensor());
  return r;
}

std::vector<Tensor> custom(const char* name, const std::vector<Tensor>& inputs,
                           const ForwardFn& forward, BackwardFn backward) {
  std::vector<Tensor> outputs;
  {
    NoGradGuard ng;
    outputs = forward(detached(inputs));
  }
  // An output that is one of the (detached) inputs must get its own handle before the graph
  // marks it: the caller's tensor must not change.
  for (auto& y : outputs)
    if (y.defined()) y = y.detach();
  record(name, inputs, outputs, std::move(backward));
  return outputs;
}

std::vector<Tensor> recompute(const ForwardFn& fn, const std::vector<Tensor>& inputs) {
  if (!needs_grad(inputs)) return fn(inputs);
  Generator& gen = current_context().rng();
  const uint64_t rng_counter = gen.counter();
  std::vector<Tensor> saved = detached(inputs);
  std::vector<bool> wants(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    wants[i] = inputs[i].defined() && inputs[i].requires_grad();
  std::vector<Tensor> outputs;
  {
    NoGradGuard ng;
    outputs = fn(saved);
  }
  for (auto& y : outputs) y = y.detach();
  record("recompute", inputs, outputs,
         [fn, saved, wants, rng_counter](const Grads& grads) -> Grads {
           // Recompute with the RNG where the forward found it, so dropout masks repeat.
           Generator& g = current_context().rng();
           const uint64_t resume = g.counter();
           g.set_counter(rng_counter);
           std::vector<Tensor> xs(saved.size());
           for (size_t i = 0; i < saved.size(); ++i) {
             if (!saved[i].defined()) continue;
             xs[i] = saved[i].detach();
             if (wants[i]) xs[i].set_requires_grad(true);
           }
           std::vector<Tensor> outs;
           {
             GradMode::set_enabled(true);
             struct Restore {
               ~Restore() { GradMode::set_enabled(false); }
             } restore;
             outs = fn(xs);
           }
           g.set_counter(resume);
           // Backward through the recomputed graph: parameters used inside fn accumulate their
           // gradients (and fire their hooks) here, the inputs' gradients are returned.
           std::vector<Tensor> roots, seeds;
           for (size_t k = 0; k < outs.size(); ++k)
             if (outs[k].requires_grad()) roots.push_back(outs[k]), seeds.push_back(grads[k]);
           if (!roots.empty()) backward(roots, seeds);
           Grads r(saved.size());
           for (size_t i = 0; i < saved.size(); ++i)
             if (wants[i]) r[i] = xs[i].grad();
           return r;
         });
  return outputs;
}

}  // namespace nxd::autograd

// The optimizer over an elementwise rule, and Lion.
#include "nxd/optim/elementwise_optimizer.h"

#include <cmath>

#include "nxd/optim/items.h"
#include "nxd/optim/meta_update.h"
#include "nxd/runtime/error.h"

namespace nxd::optim {

ElementwiseOptimizer::ElementwiseOptimizer(std::vector<ParamGroup> groups, ElementwiseRule rule,
                                           PrecisionOptions precision)
    : Optimizer(std::move(groups), rule.kind, precision), rule_(std::move(rule)) {
  NXD_CHECK(rule_.update != nullptr, "[", kind_, "] the elementwise rule has no update");
  NXD_CHECK(rule_.state.size() <= static_cast<size_t>(kMaxElementwiseState), "[", kind_,
            "] the elementwise rule keeps ", rule_.state.size(), " state tensors, at most ",
            kMaxElementwiseState);
  for (const auto& g : groups_) {
    auto& row = slots_.emplace_back();
    for (const auto& p : g.params) {
      NXD_CHECK(p.param.dtype() == DType::f32 || p.param.dtype() == DType::bf16, "[", kind_,
                "] parameter '", p.name, "' is ", p.param.desc(),
                ": an elementwise optimizer updates f32 and bf16 parameters");
      Slot s;
      for (const auto& name : rule_.state)
        s.state.push_back(add_state(p, name, StateKind::per_element));
      s.step = add_state(p, "step", StateKind::step_count);
      row.push_back(std::move(s));
    }
  }
}

void ElementwiseOptimizer::step() {
  NoGradGuard ng;
  std::vector<Tensor> grads;  // the contiguous f32 gradients, alive during the update
  std::vector<Working> work;
  std::vector<ElementwiseStep> jobs;
  std::vector<int64_t> sizes;
  for_each_with_grad([&](const ParamGroup& grp, size_t gi, size_t pi, const NamedParam& np,
                         const Tensor& g) {
    Slot& s = slots_[gi][pi];
    const int64_t t = ++*s.step.data<int64_t>();
    if (np.param.numel() == 0) return;
    detail::charge_update(rule_.kind, {.numel = np.param.numel(),
                                       .state_tensors = static_cast<int>(rule_.state.size()),
                                       .flops_per_element = rule_.cost,
                                       .param_dtype = np.param.dtype()});
    if (np.param.is_meta()) return;  // shapes only: charged, nothing computed
    grads.push_back(g);
    const Working& w = work.emplace_back(working(np, t));
    ElementwiseStep e{
        w.values.data<float>(), g.data<float>(), {}, np.param.numel(), grp.lr, grp.weight_decay, t};
    for (size_t k = 0; k < s.state.size(); ++k) e.state[k] = s.state[k].data<float>();
    jobs.push_back(e);
    sizes.push_back(np.param.numel());
  });
  detail::for_each_item(sizes, rule_.cost, [&](size_t j, int64_t b, int64_t e) {
    ElementwiseStep part = jobs[j];
    part.p += b;
    part.g += b;
    for (float*& st : part.state)
      if (st) st += b;
    part.n = e - b;
    rule_.update(part);
    work[j].write_back(b, e);
  });
  ++steps_;
}

ElementwiseRule lion_rule(const LionOptions& opts) {
  NXD_CHECK(opts.beta1 >= 0 && opts.beta1 <= 1 && opts.beta2 >= 0 && opts.beta2 < 1,
            "[Lion] need beta1 in [0, 1] and beta2 in [0, 1), got ", opts.beta1, " and ",
            opts.beta2);
  ElementwiseRule r;
  r.kind = "Lion";
  r.state = {"exp_avg"};
  r.hyperparameters = {{"beta1", opts.beta1}, {"beta2", opts.beta2}};
  r.cost = 4;
  const float b1 = static_cast<float>(opts.beta1), omb1 = static_cast<float>(1.0 - opts.beta1);
  const float b2 = static_cast<float>(opts.beta2), omb2 = static_cast<float>(1.0 - opts.beta2);
  r.update = [=](const ElementwiseStep& e) {
    const float decay = static_cast<float>(1.0 - e.lr * e.weight_decay);
    const float lr = static_cast<float>(e.lr);
    const bool do_decay = e.weight_decay != 0;
    float* __restrict p = e.p;
    const float* __restrict g = e.g;
    float* __restrict m = e.state[0];
    for (int64_t i = 0; i < e.n; ++i) {
      const float pi = do_decay ? p[i] * decay : p[i];
      const float c = b1 * m[i] + omb1 * g[i];
      const float sign = static_cast<float>((c > 0.0f) - (c < 0.0f));
      p[i] = pi - lr * sign;
      m[i] = b2 * m[i] + omb2 * g[i];
    }
  };
  return r;
}

Lion::Lion(std::vector<ParamGroup> groups, LionOptions opts)
    : ElementwiseOptimizer(std::move(groups), lion_rule(opts), opts.precision), opts_(opts) {}

void Lion::set_precision(const PrecisionOptions& p) {
  Optimizer::set_precision(p);
  opts_.precision = p;
}

}  // namespace nxd::optim

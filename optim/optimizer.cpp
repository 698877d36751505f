// SGD and AdamW over contiguous f32/f64/bf16 parameters: one pass per parameter, scalars in double;
// bf16 parameters through f32 working values (optim/precision.h).
#include "nxd/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "nxd/optim/adamw_update.h"
#include "nxd/optim/items.h"
#include "nxd/optim/meta_update.h"

namespace nxd::optim {

bool is_no_decay_param(const std::string& name, WeightDecayOptions opts) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.find("bias") != std::string::npos ||
         (!opts.do_layer_norm_weight_decay && lower.find("norm") != std::string::npos);
}

std::vector<ParamGroup> default_param_groups(const std::vector<NamedParam>& params, double lr,
                                             double weight_decay, WeightDecayOptions opts) {
  ParamGroup decay{"decay", {}, lr, weight_decay, 1.0};
  ParamGroup no_decay{"no_decay", {}, lr, 0.0, 1.0};
  for (const auto& p : params)
    if (p.param.requires_grad())  // frozen parameters (LoRA's base) get no optimizer state
      (is_no_decay_param(p.name, opts) ? no_decay : decay).params.push_back(p);
  std::vector<ParamGroup> out;
  if (!decay.params.empty()) out.push_back(std::move(decay));
  if (!no_decay.params.empty()) out.push_back(std::move(no_decay));
  return out;
}

std::vector<Tensor> params_of(const std::vector<NamedParam>& named) {
  std::vector<Tensor> out;
  out.reserve(named.size());
  for (const auto& p : named) out.push_back(p.param);
  return out;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, const char* kind, PrecisionOptions precision)
    : groups_(std::move(groups)), kind_(kind) {
  for (const auto& g : groups_) {
    NXD_CHECK(g.lr >= 0 && std::isfinite(g.lr), "[", kind_, "] group '", g.name,
              "': lr must be finite and >= 0, got ", g.lr);
    NXD_CHECK(g.weight_decay >= 0, "[", kind_, "] group '", g.name,
              "': weight_decay must be >= 0, got ", g.weight_decay);
    for (const auto& p : g.params) {
      NXD_CHECK(p.param.defined(), "[", kind_, "] parameter '", p.name, "' is undefined");
      NXD_CHECK(is_floating(p.param.dtype()), "[", kind_, "] parameter '", p.name, "' is ",
                p.param.desc(), "; parameters must be f32, f64 or bf16");
      NXD_CHECK(p.param.is_contiguous(), "[", kind_, "] parameter '", p.name,
                "' must be a contiguous tensor, got ", p.param.desc());
    }
  }
  Optimizer::set_precision(precision);
}

void Optimizer::set_precision(const PrecisionOptions& p) {
  NXD_CHECK(steps_ == 0, "[", kind_, "] set_precision() after ", steps_,
            " step(s): precision is chosen before the first step");
  const bool had = precision_.master_weights;
  precision_ = p;
  if (had == p.master_weights) return;
  if (had)  // drop the master copies
    std::erase_if(state_, [](const auto& kv) { return kv.first.ends_with(".master"); });
  if (!p.master_weights) return;
  NoGradGuard ng;
  for (const auto& g : groups_)
    for (const auto& np : g.params)
      if (np.param.dtype() == DType::bf16) {
        Tensor m = add_state(np, "master", StateKind::per_element);
        if (!np.param.is_meta()) m.copy_(np.param.detach());
      }
}

Tensor Optimizer::master(const NamedParam& p) const {
  if (!precision_.master_weights || p.param.dtype() != DType::bf16) return Tensor();
  const std::string name = p.name + ".master";
  for (const auto& [n, t] : state_)
    if (n == name) return t;
  return Tensor();
}

Optimizer::Working Optimizer::working(const NamedParam& p, int64_t t) const {
  Working w;
  if (p.param.dtype() != DType::bf16) {
    w.values = p.param.detach();
    return w;
  }
  w.round_to = p.param.detach();
  w.values = master(p);
  if (!w.values.defined()) w.values = p.param.detach().to(DType::f32);
  w.stochastic = precision_.stochastic_rounding;
  if (w.stochastic) w.noise = RoundingNoise(precision_.seed, p.name, t);
  return w;
}

void Optimizer::Working::write_back(int64_t b, int64_t e) const {
  if (!round_to.defined() || round_to.is_meta()) return;
  round_to_bf16(round_to.data<bf16>() + b, values.data<float>() + b, e - b,
                stochastic ? &noise : nullptr, b);
}

Tensor Optimizer::update_grad(const NamedParam& p) const {
  Tensor g = p.param.grad();
  if (!g.defined()) return g;
  NXD_CHECK(g.shape() == p.param.shape(), "[", kind_, "] gradient of '", p.name, "' is ", g.desc(),
            ", parameter is ", p.param.desc());
  const DType want = p.param.dtype() == DType::bf16 ? DType::f32 : p.param.dtype();
  if (g.dtype() != want) g = g.to(want);
  return g.contiguous();
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard ng;
  for (auto& g : groups_)
    for (auto& p : g.params) {
      Tensor gr = p.param.grad();
      if (!gr.defined()) continue;
      if (set_to_none)
        p.param.set_grad(Tensor());
      else
        gr.zero_();
    }
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : state_) n += t.nbytes();
  return n;
}

void Optimizer::set_lr(double lr) {
  for (auto& g : groups_) g.lr = lr * g.lr_scale;
}

std::vector<NamedParam> Optimizer::named_parameters() const {
  std::vector<NamedParam> out;
  for (const auto& g : groups_) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

Tensor Optimizer::add_state(const NamedParam& p, const std::string& what, StateKind kind) {
  const DType dt = p.param.dtype() == DType::bf16 ? DType::f32 : p.param.dtype();
  // a meta parameter's state is meta too (nxd-plan's step: shapes only); step counts are host
  Tensor t = kind == StateKind::step_count
                 ? zeros({}, DType::i64)
                 : zeros(p.param.shape(), dt, p.param.is_meta() ? Device::meta : Device::host);
  t.set_name(p.name + "." + what);
  state_.emplace_back(t.name(), t);
  return t;
}

namespace {

// AdamW's relative cost of one element (the compute pool's split, the modeled update's flops).
constexpr int64_t kAdamWCost = 8;

// One SGD update: the group's lr and weight decay, SGDOptions' momentum terms, and whether this
// is the momentum buffer's first step (buf = d).
struct SgdStep {
  double lr, weight_decay, momentum, dampening;
  bool nesterov, first;
};

template <class T>
void sgd_update(T* p, const T* g, T* buf, int64_t n, const SgdStep& s) {
  const double lr = s.lr, wd = s.weight_decay, momentum = s.momentum, dampening = s.dampening;
  const bool nesterov = s.nesterov, first = s.first;
  const T wd_t = static_cast<T>(wd), lr_t = static_cast<T>(lr);
  const T mom = static_cast<T>(momentum), damp = static_cast<T>(1.0 - dampening);
  if (!buf) {
    for (int64_t i = 0; i < n; ++i) {
      T d = wd != 0 ? g[i] + wd_t * p[i] : g[i];
      p[i] = p[i] - lr_t * d;
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    T d = wd != 0 ? g[i] + wd_t * p[i] : g[i];
    T b = first ? d : mom * buf[i] + damp * d;
    buf[i] = b;
    d = nesterov ? d + mom * b : b;
    p[i] = p[i] - lr_t * d;
  }
}

}  // namespace

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions opts)
    : Optimizer(std::move(groups), "SGD", opts.precision), opts_(opts) {
  NXD_CHECK(opts_.momentum >= 0, "[SGD] momentum must be >= 0, got ", opts_.momentum);
  NXD_CHECK(!opts_.nesterov || (opts_.momentum > 0 && opts_.dampening == 0),
            "[SGD] Nesterov momentum requires momentum > 0 and dampening == 0, got momentum=",
            opts_.momentum, " dampening=", opts_.dampening);
  for (const auto& g : groups_) {
    auto& row = slots_.emplace_back();
    for (const auto& p : g.params) {
      Slot s;
      if (opts_.momentum > 0) {
        s.buf = add_state(p, "momentum_buffer", StateKind::per_element);
        s.step = add_state(p, "step", StateKind::step_count);
      }
      row.push_back(s);
    }
  }
}

void SGD::step() {
  NoGradGuard ng;
  for_each_with_grad(
      [&](const ParamGroup& grp, size_t gi, size_t pi, const NamedParam& np, const Tensor& g) {
        Slot& s = slots_[gi][pi];
        bool first = false;
        if (s.step.defined()) {
          int64_t* t = s.step.data<int64_t>();
          first = *t == 0;
          ++*t;
        }
        detail::charge_update("SGD_update", {.numel = np.param.numel(),
                                             .state_tensors = s.buf.defined() ? 1 : 0,
                                             .flops_per_element = 2,
                                             .param_dtype = np.param.dtype()});
        if (np.param.is_meta()) return;  // shapes only: charged, nothing computed
        const Working w = working(np, steps_ + 1);
        dispatch(w.values.dtype(), [&]<class T>() {
          if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
            sgd_update<T>(w.values.data<T>(), g.data<T>(),
                          s.buf.defined() ? s.buf.data<T>() : nullptr, np.param.numel(),
                          {.lr = grp.lr,
                           .weight_decay = grp.weight_decay,
                           .momentum = opts_.momentum,
                           .dampening = opts_.dampening,
                           .nesterov = opts_.nesterov,
                           .first = first});
          }
        });
        w.write_back(0, np.param.numel());
      });
  ++steps_;
}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions opts)
    : Optimizer(std::move(groups), "AdamW", opts.precision), opts_(opts) {
  NXD_CHECK(opts_.beta1 >= 0 && opts_.beta1 < 1, "[AdamW] beta1 must be in [0, 1), got ",
            opts_.beta1);
  NXD_CHECK(opts_.beta2 >= 0 && opts_.beta2 < 1, "[AdamW] beta2 must be in [0, 1), got ",
            opts_.beta2);
  NXD_CHECK(opts_.eps >= 0, "[AdamW] eps must be >= 0, got ", opts_.eps);
  if (!opts_.defer_state) allocate_state();
}

void AdamW::allocate_state() {
  for (const auto& g : groups_) {
    auto& row = slots_.emplace_back();
    for (const auto& p : g.params) {
      Slot s;
      s.m = add_state(p, "exp_avg", StateKind::per_element);
      s.v = add_state(p, "exp_avg_sq", StateKind::per_element);
      s.step = add_state(p, "step", StateKind::step_count);
      row.push_back(s);
    }
  }
}

void AdamW::set_precision(const PrecisionOptions& p) {
  Optimizer::set_precision(p);
  opts_.precision = p;
}

void SGD::set_precision(const PrecisionOptions& p) {
  Optimizer::set_precision(p);
  opts_.precision = p;
}

void AdamW::step() {
  NoGradGuard ng;
  if (slots_.size() != groups_.size()) allocate_state();  // defer_state
  std::vector<Tensor> grads;  // keeps the contiguous gradients alive during the update
  std::vector<Working> work;  // where each job's update runs (and its rounding into bf16)
  std::vector<detail::AdamWUpdate<float>> f32;
  std::vector<detail::AdamWUpdate<double>> f64;
  std::vector<int64_t> sizes;
  std::vector<std::pair<int, size_t>> jobs;  // (0 = f32 / 1 = f64, index)
  for_each_with_grad(
      [&](const ParamGroup& grp, size_t gi, size_t pi, const NamedParam& np, const Tensor& g) {
        Slot& s = slots_[gi][pi];
        int64_t t = ++*s.step.data<int64_t>();
        if (np.param.numel() == 0) return;
        detail::charge_update("AdamW_update", {.numel = np.param.numel(),
                                               .state_tensors = 2,
                                               .flops_per_element = kAdamWCost,
                                               .param_dtype = np.param.dtype()});
        if (np.param.is_meta()) return;  // shapes only: charged, nothing computed
        grads.push_back(g);
        sizes.push_back(np.param.numel());
        const Working& w = work.emplace_back(working(np, t));
        const detail::AdamWStep hyper{.lr = grp.lr,
                                      .weight_decay = grp.weight_decay,
                                      .beta1 = opts_.beta1,
                                      .beta2 = opts_.beta2,
                                      .eps = opts_.eps,
                                      .t = t};
        if (w.values.dtype() == DType::f32) {
          jobs.push_back({0, f32.size()});
          f32.emplace_back(w.values.data<float>(), g.data<float>(), s.m.data<float>(),
                           s.v.data<float>(), hyper);
        } else {
          jobs.push_back({1, f64.size()});
          f64.emplace_back(w.values.data<double>(), g.data<double>(), s.m.data<double>(),
                           s.v.data<double>(), hyper);
        }
      });
  detail::for_each_item(sizes, kAdamWCost, [&](size_t j, int64_t b, int64_t e) {
    if (jobs[j].first == 0)
      f32[jobs[j].second](b, e);
    else
      f64[jobs[j].second](b, e);
    work[j].write_back(b, e);
  });
  ++steps_;
}

}  // namespace nxd::optim

namespace nxd::optim {

std::vector<std::pair<std::string, double>> SGD::hyperparameters() const {
  return {{"momentum", opts_.momentum},
          {"dampening", opts_.dampening},
          {"nesterov", opts_.nesterov ? 1.0 : 0.0}};
}

std::optional<ElementwiseRule> SGD::elementwise_rule() const {
  ElementwiseRule r;
  r.kind = kind_;
  if (opts_.momentum > 0) r.state = {"momentum_buffer"};
  r.hyperparameters = hyperparameters();
  r.cost = 2;
  const SGDOptions o = opts_;
  r.update = [o](const ElementwiseStep& e) {
    sgd_update<float>(e.p, e.g, o.momentum > 0 ? e.state[0] : nullptr, e.n,
                      {.lr = e.lr,
                       .weight_decay = e.weight_decay,
                       .momentum = o.momentum,
                       .dampening = o.dampening,
                       .nesterov = o.nesterov,
                       .first = e.t == 1});
  };
  return r;
}

std::vector<std::pair<std::string, double>> AdamW::hyperparameters() const {
  return adamw_rule(opts_).hyperparameters;
}

std::optional<ElementwiseRule> AdamW::elementwise_rule() const {
  return adamw_rule(opts_);
}

ElementwiseRule adamw_rule(const AdamWOptions& opts) {
  ElementwiseRule r;
  r.kind = "AdamW";
  r.state = {"exp_avg", "exp_avg_sq"};
  r.hyperparameters = {{"beta1", opts.beta1}, {"beta2", opts.beta2}, {"eps", opts.eps}};
  const AdamWOptions o = opts;
  r.update = [o](const ElementwiseStep& e) {
    detail::AdamWUpdate<float>(e.p, e.g, e.state[0], e.state[1],
                               {.lr = e.lr,
                                .weight_decay = e.weight_decay,
                                .beta1 = o.beta1,
                                .beta2 = o.beta2,
                                .eps = o.eps,
                                .t = e.t})(0, e.n);
  };
  return r;
}

}  // namespace nxd::optim

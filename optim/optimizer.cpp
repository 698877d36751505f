// SGD and AdamW over contiguous f32/f64 parameters: one pass per parameter, scalars in double.
#include "nxd/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "nxd/optim/adamw_update.h"
#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::optim {

bool is_no_decay_param(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.find("bias") != std::string::npos || lower.find("norm") != std::string::npos;
}

std::vector<ParamGroup> default_param_groups(const std::vector<NamedParam>& params, double lr,
                                             double weight_decay) {
  ParamGroup decay{"decay", {}, lr, weight_decay, 1.0};
  ParamGroup no_decay{"no_decay", {}, lr, 0.0, 1.0};
  for (const auto& p : params) (is_no_decay_param(p.name) ? no_decay : decay).params.push_back(p);
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

Optimizer::Optimizer(std::vector<ParamGroup> groups, const char* kind)
    : groups_(std::move(groups)), kind_(kind) {
  for (const auto& g : groups_) {
    NXD_CHECK(g.lr >= 0 && std::isfinite(g.lr), "[", kind_, "] group '", g.name,
              "': lr must be finite and >= 0, got ", g.lr);
    NXD_CHECK(g.weight_decay >= 0, "[", kind_, "] group '", g.name,
              "': weight_decay must be >= 0, got ", g.weight_decay);
    for (const auto& p : g.params) {
      NXD_CHECK(p.param.defined(), "[", kind_, "] parameter '", p.name, "' is undefined");
      NXD_CHECK(p.param.dtype() == DType::f32 || p.param.dtype() == DType::f64, "[", kind_,
                "] parameter '", p.name, "' is ", p.param.desc(),
                "; only f32/f64 parameters are supported (bf16 needs f32 master weights)");
      NXD_CHECK(p.param.is_contiguous() && !p.param.is_meta(), "[", kind_, "] parameter '", p.name,
                "' must be a contiguous host tensor, got ", p.param.desc());
    }
  }
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

void Optimizer::set_lr(double lr) {
  for (auto& g : groups_) g.lr = lr * g.lr_scale;
}

std::vector<NamedParam> Optimizer::named_parameters() const {
  std::vector<NamedParam> out;
  for (const auto& g : groups_) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

Tensor Optimizer::add_state(const NamedParam& p, const std::string& what, bool scalar_step) {
  Tensor t = scalar_step ? zeros({}, DType::i64) : zeros(p.param.shape(), p.param.dtype());
  t.set_name(p.name + "." + what);
  state_.emplace_back(t.name(), t);
  return t;
}

namespace {

// The gradient of p as a contiguous tensor of p's dtype and shape, or undefined if none.
Tensor grad_for_update(const NamedParam& p, const char* kind) {
  Tensor g = p.param.grad();
  if (!g.defined()) return g;
  NXD_CHECK(g.shape() == p.param.shape(), "[", kind, "] gradient of '", p.name, "' is ", g.desc(),
            ", parameter is ", p.param.desc());
  if (g.dtype() != p.param.dtype()) g = g.to(p.param.dtype());
  return g.contiguous();
}

template <class T>
void sgd_update(T* p, const T* g, T* buf, int64_t n, bool first, double lr, double wd,
                double momentum, double dampening, bool nesterov) {
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

// Elements per work item of the optimizer and norm loops over all parameters.
constexpr int64_t kItem = 16384;

// Runs the element ranges of several tensors' jobs as one parallel loop: job j covers
// [0, sizes[j]) and is cut into items of kItem elements; fn(j, begin, end) per item.
void for_each_item(const std::vector<int64_t>& sizes, int64_t cost,
                   const std::function<void(size_t, int64_t, int64_t)>& fn) {
  struct Item {
    size_t job;
    int64_t begin, end;
  };
  std::vector<Item> items;
  for (size_t j = 0; j < sizes.size(); ++j)
    for (int64_t b = 0; b < sizes[j]; b += kItem)
      items.push_back({j, b, std::min(sizes[j], b + kItem)});
  kernels::for_rows(static_cast<int64_t>(items.size()), kItem * cost, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) fn(items[i].job, items[i].begin, items[i].end);
  });
}

}  // namespace

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions opts)
    : Optimizer(std::move(groups), "SGD"), opts_(opts) {
  NXD_CHECK(opts_.momentum >= 0, "[SGD] momentum must be >= 0, got ", opts_.momentum);
  NXD_CHECK(!opts_.nesterov || (opts_.momentum > 0 && opts_.dampening == 0),
            "[SGD] Nesterov momentum requires momentum > 0 and dampening == 0, got momentum=",
            opts_.momentum, " dampening=", opts_.dampening);
  for (const auto& g : groups_) {
    auto& row = slots_.emplace_back();
    for (const auto& p : g.params) {
      Slot s;
      if (opts_.momentum > 0) {
        s.buf = add_state(p, "momentum_buffer", false);
        s.step = add_state(p, "step", true);
      }
      row.push_back(s);
    }
  }
}

void SGD::step() {
  NoGradGuard ng;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& grp = groups_[gi];
    for (size_t pi = 0; pi < grp.params.size(); ++pi) {
      const NamedParam& np = grp.params[pi];
      Tensor g = grad_for_update(np, "SGD");
      if (!g.defined()) continue;
      Slot& s = slots_[gi][pi];
      bool first = false;
      if (s.step.defined()) {
        int64_t* t = s.step.data<int64_t>();
        first = *t == 0;
        ++*t;
      }
      dispatch(np.param.dtype(), [&]<class T>() {
        if constexpr (std::is_floating_point_v<T>) {
          sgd_update<T>(np.param.data<T>(), g.data<T>(),
                        s.buf.defined() ? s.buf.data<T>() : nullptr, np.param.numel(), first,
                        grp.lr, grp.weight_decay, opts_.momentum, opts_.dampening, opts_.nesterov);
        }
      });
    }
  }
  ++steps_;
}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions opts)
    : Optimizer(std::move(groups), "AdamW"), opts_(opts) {
  NXD_CHECK(opts_.beta1 >= 0 && opts_.beta1 < 1, "[AdamW] beta1 must be in [0, 1), got ",
            opts_.beta1);
  NXD_CHECK(opts_.beta2 >= 0 && opts_.beta2 < 1, "[AdamW] beta2 must be in [0, 1), got ",
            opts_.beta2);
  NXD_CHECK(opts_.eps >= 0, "[AdamW] eps must be >= 0, got ", opts_.eps);
  for (const auto& g : groups_) {
    auto& row = slots_.emplace_back();
    for (const auto& p : g.params) {
      Slot s;
      s.m = add_state(p, "exp_avg", false);
      s.v = add_state(p, "exp_avg_sq", false);
      s.step = add_state(p, "step", true);
      row.push_back(s);
    }
  }
}

void AdamW::step() {
  NoGradGuard ng;
  std::vector<Tensor> grads;  // keeps the contiguous gradients alive during the update
  std::vector<detail::AdamWUpdate<float>> f32;
  std::vector<detail::AdamWUpdate<double>> f64;
  std::vector<int64_t> sizes;
  std::vector<std::pair<int, size_t>> jobs;  // (0 = f32 / 1 = f64, index)
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& grp = groups_[gi];
    for (size_t pi = 0; pi < grp.params.size(); ++pi) {
      const NamedParam& np = grp.params[pi];
      Tensor g = grad_for_update(np, "AdamW");
      if (!g.defined()) continue;
      Slot& s = slots_[gi][pi];
      int64_t t = ++*s.step.data<int64_t>();
      if (np.param.numel() == 0) continue;
      grads.push_back(g);
      sizes.push_back(np.param.numel());
      if (np.param.dtype() == DType::f32) {
        jobs.push_back({0, f32.size()});
        f32.emplace_back(np.param.data<float>(), g.data<float>(), s.m.data<float>(),
                         s.v.data<float>(), grp.lr, grp.weight_decay, opts_.beta1, opts_.beta2,
                         opts_.eps, t);
      } else {
        jobs.push_back({1, f64.size()});
        f64.emplace_back(np.param.data<double>(), g.data<double>(), s.m.data<double>(),
                         s.v.data<double>(), grp.lr, grp.weight_decay, opts_.beta1, opts_.beta2,
                         opts_.eps, t);
      }
    }
  }
  for_each_item(sizes, 8, [&](size_t j, int64_t b, int64_t e) {
    if (jobs[j].first == 0)
      f32[jobs[j].second](b, e);
    else
      f64[jobs[j].second](b, e);
  });
  ++steps_;
}

// ---- norms ----

double grad_stat(const Tensor& grad, bool inf) {
  Tensor g = grad.contiguous();
  NXD_CHECK(is_floating(g.dtype()), "[grad_norm] gradient ", g.desc(), " is not floating point");
  // 1024-element blocks, each into its own double partial (8 interleaved lanes, so the loop
  // vectorizes, combined pairwise); the partials are added in block order
  constexpr int64_t kPart = 1024, kLanes = 8;
  const int64_t n = g.numel();
  std::vector<double> part(kernels::num_chunks(n, kPart));
  auto run = [&](auto load) {
    kernels::for_chunks(n, kPart, 2, [&](int64_t c, int64_t i0, int64_t i1) {
      double acc[kLanes] = {};
      int64_t i = i0;
      if (inf) {
        for (; i < i1; ++i) acc[0] = std::max(acc[0], std::abs(load(i)));
        part[c] = acc[0];
        return;
      }
      for (; i + kLanes <= i1; i += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) {
          const double x = load(i + l);
          acc[l] += x * x;
        }
      for (int64_t w = kLanes / 2; w > 0; w /= 2)
        for (int64_t l = 0; l < w; ++l) acc[l] += acc[l + w];
      for (; i < i1; ++i) {
        const double x = load(i);
        acc[0] += x * x;
      }
      part[c] = acc[0];
    });
  };
  dispatch(g.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                  std::is_same_v<T, bf16>) {
      const T* d = g.data<T>();
      if constexpr (std::is_same_v<T, bf16>)
        run([d](int64_t i) { return static_cast<double>(static_cast<float>(d[i])); });
      else
        run([d](int64_t i) { return static_cast<double>(d[i]); });
    }
  });
  double s = 0;
  for (double p : part) s = inf ? std::max(s, p) : s + p;
  return s;
}

double grad_norm(const std::vector<Tensor>& params, double norm_type) {
  NXD_CHECK(norm_type == kInfNorm || norm_type == 2.0,
            "[grad_norm] norm_type must be 2 or kInfNorm (-1), got ", norm_type);
  NoGradGuard ng;
  const bool inf = norm_type == kInfNorm;
  double acc = 0.0;
  for (const auto& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    const double s = grad_stat(g, inf);
    acc = inf ? std::max(acc, s) : acc + s;
  }
  return inf ? acc : std::sqrt(acc);
}

void scale_grads(const std::vector<Tensor>& params, double coef) {
  NoGradGuard ng;
  std::vector<Tensor> fast;
  std::vector<int64_t> sizes;
  for (const auto& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.is_contiguous() && (g.dtype() == DType::f32 || g.dtype() == DType::f64)) {
      fast.push_back(g);
      sizes.push_back(g.numel());
    } else {
      std::vector<double> v = g.to_vector();
      for (auto& x : v) x *= coef;
      g.copy_(from_doubles(v, g.shape(), DType::f64));
    }
  }
  for_each_item(sizes, 1, [&](size_t j, int64_t b, int64_t e) {
    dispatch(fast[j].dtype(), [&]<class T>() {
      if constexpr (std::is_floating_point_v<T>) {
        T* d = fast[j].data<T>();
        const T c = static_cast<T>(coef);
        for (int64_t i = b; i < e; ++i) d[i] *= c;
      }
    });
  });
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  NXD_CHECK(max_norm > 0, "[clip_grad_norm] max_norm must be > 0, got ", max_norm);
  const double total = grad_norm(params, norm_type);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) scale_grads(params, coef);
  return total;
}

}  // namespace nxd::optim

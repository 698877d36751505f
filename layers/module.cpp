#include "nxd/layers/module.h"

#include <cmath>
#include <sstream>
#include <unordered_set>

#include "nxd/autograd/graph.h"
#include "nxd/runtime/rng.h"

namespace nxd {

// ---- StateDict ----

void StateDict::insert(const std::string& name, const Tensor& t) {
  NXD_CHECK(!contains(name), "[StateDict] duplicate key '", name, "'");
  index_.emplace(name, items_.size());
  items_.emplace_back(name, t);
}

void StateDict::set(const std::string& name, const Tensor& t) {
  auto it = index_.find(name);
  if (it == index_.end()) {
    insert(name, t);
  } else {
    items_[it->second].second = t;
  }
}

const Tensor* StateDict::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

const Tensor& StateDict::at(const std::string& name) const {
  const Tensor* t = find(name);
  NXD_CHECK(t != nullptr, "[StateDict] no key '", name, "'");
  return *t;
}

bool StateDict::erase(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) return false;
  items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(it->second));
  index_.clear();
  for (size_t i = 0; i < items_.size(); ++i) index_.emplace(items_[i].first, i);
  return true;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> k;
  k.reserve(items_.size());
  for (const auto& [n, t] : items_) k.push_back(n);
  return k;
}

// ---- Module ----

void Module::check_new_name(const std::string& name, const char* what) const {
  NXD_CHECK(!name.empty() && name.find('.') == std::string::npos, "[", type_name_, "] ", what,
            " name '", name, "' must be non-empty and contain no '.'");
  bool taken = false;
  for (const auto& p : params_) taken |= p.name == name;
  for (const auto& b : buffers_) taken |= b.name == name;
  for (const auto& c : children_) taken |= c.first == name;
  NXD_CHECK(!taken, "[", type_name_, "] name '", name, "' is already registered");
}

const Tensor& Module::register_parameter(const std::string& name, Tensor t, ParamInit init) {
  check_new_name(name, "parameter");
  NXD_CHECK(t.defined(), "[", type_name_, "] parameter '", name, "' is undefined");
  NXD_CHECK(is_floating(t.dtype()), "[", type_name_, "] parameter '", name,
            "' must be floating, got ", t.desc());
  t.set_requires_grad(true);
  params_.push_back({name, std::move(t), std::move(init)});
  return params_.back().tensor;
}

const Tensor& Module::register_buffer(const std::string& name, Tensor t, bool persistent) {
  check_new_name(name, "buffer");
  NXD_CHECK(t.defined(), "[", type_name_, "] buffer '", name, "' is undefined");
  buffers_.push_back({name, std::move(t), persistent});
  return buffers_.back().tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name, "child module");
  NXD_CHECK(m != nullptr, "[", type_name_, "] child module '", name, "' is null");
  NXD_CHECK(m.get() != this, "[", type_name_, "] a module cannot be its own child");
  children_.emplace_back(name, std::move(m));
}

template <class F>
void Module::visit(const std::string& prefix, F&& f) const {
  f(prefix, *this);
  for (const auto& [n, c] : children_) c->visit(prefix + n + ".", f);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const TensorImpl*> seen;
  auto add = [&](const std::string& prefix, const Module& m) {
    for (const auto& p : m.params_)
      if (seen.insert(p.tensor.impl()).second) out.emplace_back(prefix + p.name, p.tensor);
  };
  if (recurse) {
    visit("", add);
  } else {
    add("", *this);
  }
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  auto add = [&](const std::string& prefix, const Module& m) {
    for (const auto& b : m.buffers_) out.emplace_back(prefix + b.name, b.tensor);
  };
  if (recurse) {
    visit("", add);
  } else {
    add("", *this);
  }
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  visit("", [&](const std::string& prefix, const Module& m) {
    std::string name = prefix.empty() ? prefix : prefix.substr(0, prefix.size() - 1);
    out.emplace_back(name, const_cast<Module*>(&m));
  });
  return out;
}

const Module::Param* Module::find_param(const std::string& name) const {
  const Module* m = this;
  std::string rest = name;
  for (size_t dot; (dot = rest.find('.')) != std::string::npos;) {
    std::string head = rest.substr(0, dot);
    const Module* next = nullptr;
    for (const auto& [n, c] : m->children_)
      if (n == head) next = c.get();
    if (!next) return nullptr;
    m = next;
    rest = rest.substr(dot + 1);
  }
  for (const auto& p : m->params_)
    if (p.name == rest) return &p;
  return nullptr;
}

Tensor Module::get_parameter(const std::string& name) const {
  const Param* p = find_param(name);
  NXD_CHECK(p != nullptr, "[", type_name_, "] no parameter '", name, "'");
  return p->tensor;
}

const ParamInit& Module::param_init(const std::string& name) const {
  const Param* p = find_param(name);
  NXD_CHECK(p != nullptr, "[", type_name_, "] no parameter '", name, "'");
  return p->init;
}

std::shared_ptr<Module> Module::get_child(const std::string& name) const {
  for (const auto& [n, c] : children_)
    if (n == name) return c;
  throw InvalidArgument(str("[", type_name_, "] no child module '", name, "'"));
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

StateDict Module::state_dict() const {
  StateDict d;
  visit("", [&](const std::string& prefix, const Module& m) {
    for (const auto& p : m.params_) d.insert(prefix + p.name, p.tensor.detach());
    for (const auto& b : m.buffers_)
      if (b.persistent) d.insert(prefix + b.name, b.tensor.detach());
  });
  return d;
}

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", '" : "'") + v[i] + "'";
  return s;
}
}  // namespace

LoadResult Module::load_state_dict(const StateDict& dict, bool strict) {
  StateDict own = state_dict();
  LoadResult r;
  // Check everything before copying anything.
  for (const auto& [name, t] : own) {
    const Tensor* src = dict.find(name);
    if (!src) {
      r.missing_keys.push_back(name);
      continue;
    }
    NXD_CHECK(src->defined(), "[load_state_dict] '", name, "' is undefined in the state dict");
    NXD_CHECK_SHAPE(src->shape() == t.shape(), "[load_state_dict] shape mismatch for '", name,
                    "': state dict has ", shape_str(src->shape()), ", model has ",
                    shape_str(t.shape()));
    NXD_CHECK(src->dtype() == t.dtype(), "[load_state_dict] dtype mismatch for '", name,
              "': state dict has ", src->desc(), ", model has ", t.desc());
  }
  for (const auto& [name, t] : dict)
    if (!own.contains(name)) r.unexpected_keys.push_back(name);
  if (strict && !r.ok()) {
    std::ostringstream os;
    os << "[load_state_dict] state dict does not match " << type_name_ << ":";
    if (!r.missing_keys.empty()) os << " missing keys " << join(r.missing_keys) << ";";
    if (!r.unexpected_keys.empty()) os << " unexpected keys " << join(r.unexpected_keys) << ";";
    throw InvalidArgument(os.str());
  }
  NoGradGuard ng;
  for (const auto& [name, t] : own)
    if (const Tensor* src = dict.find(name))
      if (!t.is_meta() && !src->is_meta() && !t.is_same(*src)) t.copy_(src->detach());
  return r;
}

ParamInit ParamInit::for_fan_in(int64_t fan_in) const {
  if (kind != Kind::fan_in_uniform) return *this;
  NXD_CHECK(fan_in > 0, "[ParamInit::for_fan_in] fan_in must be positive, got ", fan_in);
  const double bound = a / std::sqrt(static_cast<double>(fan_in));
  ParamInit r = uniform(-bound, bound);
  r.region = region;
  return r;
}

void ParamInit::apply(const Tensor& t, uint64_t seed, const std::string& full_name) const {
  RngStream s{seed, stream_id(full_name.c_str())};
  const init::Region* r = region ? &*region : nullptr;
  switch (kind) {
    case Kind::none:
      break;
    case Kind::zeros:
      t.fill_(0.0);
      break;
    case Kind::ones:
      t.fill_(1.0);
      break;
    case Kind::constant:
      t.fill_(a);
      break;
    case Kind::normal:
      init::normal(t, s, a, b, r);
      break;
    case Kind::uniform:
      init::uniform(t, s, a, b, r);
      break;
    case Kind::fan_in_uniform:
      throw InvalidArgument("[Module::init_parameters] parameter '" + full_name +
                            "' has a fan_in_uniform rule its layer did not resolve with "
                            "ParamInit::for_fan_in(fan_in)");
  }
}

void Module::init_parameters(uint64_t seed, const std::string& prefix) {
  NoGradGuard ng;
  visit(prefix, [&](const std::string& pre, const Module& m) {
    for (const auto& p : m.params_) {
      Tensor t = p.tensor.detach();
      if (!t.is_meta()) p.init.apply(t, seed, pre + p.name);
    }
  });
}

namespace {
// Points t's TensorImpl at fresh contiguous storage of `dtype` on `device` (every handle on the
// impl sees it); returns the old contents as a tensor (undefined for meta).
Tensor rebind(const Tensor& t, DType dtype, Device device) {
  Tensor old = t.detach();
  TensorImpl& impl = *t.impl();
  impl.storage = Storage::allocate(t.numel() * dtype_size(dtype), device);
  impl.dtype = dtype;
  impl.strides = contiguous_strides(impl.shape);
  impl.offset = 0;
  return old;
}
}  // namespace

int64_t Module::materialize(uint64_t seed, const TensorInitFn& init, const std::string& prefix) {
  NoGradGuard ng;
  int64_t bytes = 0;
  visit(prefix, [&](const std::string& pre, const Module& m) {
    auto fill = [&](const Tensor& t, const std::string& name, const ParamInit* rule) {
      if (!t.is_meta()) return;
      rebind(t, t.dtype(), Device::host);
      bytes += t.nbytes();
      const Tensor d = t.detach();
      if (init)
        init(name, d);
      else if (rule)
        rule->apply(d, seed, name);
      else
        d.zero_();
    };
    for (const auto& p : m.params_) fill(p.tensor, pre + p.name, &p.init);
    for (const auto& b : m.buffers_) fill(b.tensor, pre + b.name, nullptr);
  });
  return bytes;
}

void Module::to_dtype(DType dtype) {
  NXD_CHECK(is_floating(dtype), "[Module::to_dtype] ", dtype_name(dtype),
            " is not a floating dtype");
  NoGradGuard ng;
  visit("", [&](const std::string&, const Module& m) {
    auto convert_one = [&](const Tensor& t) {
      if (!is_floating(t.dtype()) || t.dtype() == dtype) return;
      const Tensor old = rebind(t, dtype, t.device());
      if (!t.is_meta()) t.detach().copy_(old);
      if (t.requires_grad() && autograd::is_leaf(t)) {
        t.set_grad(Tensor());
        autograd::set_grad_buffer(t, Tensor());
      }
    };
    for (const auto& p : m.params_) convert_one(p.tensor);
    for (const auto& b : m.buffers_) convert_one(b.tensor);
  });
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::zero_grad(bool set_to_none) {
  for (auto& [n, t] : named_parameters()) {
    if (set_to_none) {
      t.set_grad(Tensor());
    } else if (t.grad().defined()) {
      NoGradGuard ng;
      t.grad().zero_();
    }
  }
}

}  // namespace nxd

#include "nxd/layers/parallel/lora.h"

#include <cmath>
#include <regex>
#include <set>
#include <unordered_set>

#include "nxd/autograd/ops.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/parallel/mappings.h"
#include "nxd/layers/quantize.h"
#include "nxd/runtime/error.h"

namespace nxd {

double LoraConfig::scale() const {
  const double r = static_cast<double>(lora_rank);
  return use_rslora ? lora_alpha / std::sqrt(r) : lora_alpha / r;
}

void LoraConfig::validate() const {
  NXD_CHECK_T(ConfigError, lora_rank >= 1, "[lora] lora_rank must be >= 1, got ", lora_rank);
  NXD_CHECK_T(ConfigError, lora_alpha > 0 && std::isfinite(lora_alpha),
              "[lora] lora_alpha must be > 0, got ", lora_alpha);
  NXD_CHECK_T(ConfigError, lora_dropout >= 0 && lora_dropout < 1,
              "[lora] lora_dropout must be in [0, 1), got ", lora_dropout);
  NXD_CHECK_T(ConfigError, !target_modules.empty() || !target_regex.empty(),
              "[lora] target_modules is empty: name the linear layers to adapt (e.g. [q_proj, "
              "v_proj])");
}

// ---------------------------------------------------------------- ParallelModule's LoRA slot

bool ParallelModule::lora_target(LoraTarget&) const {
  return false;
}

void ParallelModule::set_lora(std::shared_ptr<LoraAdapter> adapter) {
  NXD_CHECK(adapter != nullptr, "[lora] set_lora on a ", type_name(), " without an adapter");
  NXD_CHECK(lora_ == nullptr, "[lora] this ", type_name(), " already has a LoRA adapter");
  register_module("lora_A", adapter->lora_A());
  register_module("lora_B", adapter->lora_B());
  lora_ = std::move(adapter);
}

// ---------------------------------------------------------------- LoraAdapter

namespace {

// lora_A or lora_B: one "weight" with its parallel attributes.
class LoraWeight : public ParallelModule {
 public:
  LoraWeight(const Shape& shape, const ParamInit& init, const ParamOptions& p,
             const ParallelAttrs& attrs)
      : ParallelModule("LoraLinear") {
    register_parameter("weight", zeros(shape, p.dtype, p.device), init);
    set_parallel_attrs("weight", attrs);
  }
  Tensor weight() const { return get_parameter("weight"); }
};

Tensor weight_of(const ParallelModule& m) {
  return static_cast<const LoraWeight&>(m).weight();
}

}  // namespace

LoraAdapter::LoraAdapter(const LoraTarget& t, const LoraConfig& c)
    : t_(t), cfg_(c), scale_(c.scale()), dropout_(c.lora_dropout) {
  NXD_CHECK(t.group != nullptr, "[lora] the adapted layer has no TP group");
  const int tp = t.group->size();
  NXD_CHECK_T(ConfigError, t.stride == 1 || tp == 1,
              "[lora] a fused column-parallel layer (stride ", t.stride,
              ") cannot be adapted at tensor parallel size ", tp);
  const int64_t r = c.lora_rank;
  const ParamInit a_init = c.init_lora_weights == LoraConfig::Init::gaussian
                               ? ParamInit::normal(1.0 / static_cast<double>(r))
                               : ParamInit::fan_in_uniform().for_fan_in(t.in);
  ParallelAttrs sharded;
  sharded.tensor_model_parallel = tp > 1;
  sharded.num_partitions = tp;
  ParallelAttrs dup;  // duplicated over TP; partial per rank under SP
  dup.sequence_parallel_enabled = t.sequence_parallel && tp > 1;
  if (t.style == LoraTarget::Style::column) {
    sharded.partition_dim = 0;
    sharded.kv_replicas = t.kv_replicas;
    a_ = std::make_shared<LoraWeight>(Shape{r, t.in}, a_init, t.param, dup);
    b_ = std::make_shared<LoraWeight>(Shape{t.local_out, r}, ParamInit::zeros(), t.param, sharded);
  } else {
    sharded.partition_dim = 1;
    ParamInit ai = a_init;
    ai.region = init::Region{{r, t.in}, {0, t.in0}};
    a_ = std::make_shared<LoraWeight>(Shape{r, t.local_in}, ai, t.param, sharded);
    b_ = std::make_shared<LoraWeight>(Shape{t.out, r}, ParamInit::zeros(), t.param, dup);
  }
}

Tensor LoraAdapter::delta(const Tensor& x) const {
  Communicator& g = *t_.group;
  const int tp = g.size();
  const int64_t d = t_.sequence_dimension;
  auto drop = [&](const Tensor& v) {
    return dropout_ > 0 && a_->is_training() ? dropout(v, dropout_, /*training=*/true) : v;
  };
  Tensor h;
  if (t_.style == LoraTarget::Style::column) {
    h = linear(drop(x), weight_of(*a_));
    if (tp > 1)
      h = t_.sequence_parallel ? gather_from_sequence_parallel_region(h, d, true, g)
                               : copy_to_tensor_model_parallel_region(h, g);
    Tensor b = weight_of(*b_);
    if (t_.kv_group) b = copy_to_tensor_model_parallel_region(b, *t_.kv_group);
    return mul(linear(h, b), scale_);
  }
  Tensor xin = t_.input_is_parallel || tp == 1 ? x : scatter_to_tensor_model_parallel_region(x, g);
  h = linear(drop(xin), weight_of(*a_));
  if (tp > 1)
    h = t_.sequence_parallel ? reduce_scatter_to_sequence_parallel_region(h, d, g)
                             : reduce_from_tensor_model_parallel_region(h, g);
  return mul(linear(h, weight_of(*b_)), scale_);
}

Tensor LoraAdapter::delta_weight() const {
  NoGradGuard ng;
  return mul(matmul(weight_of(*b_).detach(), weight_of(*a_).detach()), scale_);
}

// ---------------------------------------------------------------- applying

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool name_matches(const std::string& name, const std::string& entry) {
  return name == entry || ends_with(name, "." + entry);
}

// The entries of cfg that select `name` (the regex listed under its own text).
std::vector<std::string> selecting(const LoraConfig& cfg, const std::regex* re,
                                   const std::string& name) {
  std::vector<std::string> hits;
  for (const std::string& e : cfg.target_modules) {
    bool hit = name_matches(name, e);
    if (e == "qkv_proj")  // NxD's fused attention projection: nxd's q/k/v_proj
      for (const char* p : {"q_proj", "k_proj", "v_proj"}) hit = hit || name_matches(name, p);
    if (hit) hits.push_back(e);
  }
  if (re && std::regex_match(name, *re)) hits.push_back(cfg.target_regex);
  return hits;
}

}  // namespace

LoraReport apply_lora(Module& root, const LoraConfig& cfg, uint64_t seed,
                      const std::string& prefix) {
  cfg.validate();
  std::optional<std::regex> re;
  if (!cfg.target_regex.empty()) {
    try {
      re.emplace(cfg.target_regex);
    } catch (const std::regex_error& e) {
      throw ConfigError(str("[lora] target_modules '", cfg.target_regex,
                            "' is not a regular expression: ", e.what()));
    }
  }
  LoraReport rep;
  for (const std::string& e : cfg.target_modules) rep.entry_matches[e] = 0;
  if (re) rep.entry_matches[cfg.target_regex] = 0;
  for (auto& [name, m] : root.named_modules()) {
    const std::vector<std::string> hits = selecting(cfg, re ? &*re : nullptr, name);
    if (hits.empty() || name.empty()) continue;
    auto* pm = dynamic_cast<ParallelModule*>(m);
    LoraTarget t;
    NXD_CHECK_T(ConfigError, pm != nullptr && pm->lora_target(t), "[lora] target_modules entry '",
                hits.front(), "' selects '", name, "', a ", m->type_name(),
                ", which is not a linear layer LoRA can adapt (ColumnParallelLinear, "
                "RowParallelLinear, the attention's q/k/v_proj)");
    NXD_CHECK_T(ConfigError, pm->lora() == nullptr, "[lora] '", name, "' already has an adapter");
    check_no_quantized_layers(*m, str("lora on '", name, "'"));
    for (const std::string& h : hits) ++rep.entry_matches[h];
    auto adapter = std::make_shared<LoraAdapter>(t, cfg);
    pm->set_lora(adapter);
    adapter->lora_A()->init_parameters(seed, prefix + name + ".lora_A.");
    adapter->lora_B()->init_parameters(seed, prefix + name + ".lora_B.");
    rep.adapted.push_back(name);
  }
  for (auto& [n, t] : root.named_parameters()) {
    rep.total += t.numel();
    if (is_lora_name(n))
      rep.trainable += t.numel();
    else
      t.set_requires_grad(false);
  }
  return rep;
}

void check_lora_matches(const LoraConfig& cfg, const std::vector<LoraReport>& reports,
                        const std::vector<Module*>& parts) {
  std::map<std::string, int64_t> hits;
  for (const LoraReport& r : reports)
    for (const auto& [e, n] : r.entry_matches) hits[e] += n;
  std::string missing;
  for (const auto& [e, n] : hits)
    if (n == 0) missing += (missing.empty() ? "'" : ", '") + e + "'";
  if (missing.empty()) return;
  std::set<std::string> linear;
  for (Module* p : parts)
    for (auto& [name, m] : p->named_modules()) {
      LoraTarget t;
      auto* pm = dynamic_cast<ParallelModule*>(m);
      if (pm && pm->lora_target(t)) linear.insert(name.substr(name.rfind('.') + 1));
    }
  std::string known;
  for (const std::string& l : linear) known += (known.empty() ? "" : ", ") + l;
  throw ConfigError(str("[lora] target_modules ", missing,
                        " matches no linear layer of the model (its linear layers: ", known, ")"));
}

const LoraConfig* find_lora_config(Module& root) {
  for (auto& [n, m] : root.named_modules())
    if (auto* pm = dynamic_cast<ParallelModule*>(m); pm && pm->lora()) return &pm->lora()->config();
  return nullptr;
}

bool is_lora_name(const std::string& n) {
  return ends_with(n, "lora_A.weight") || ends_with(n, "lora_B.weight");
}

std::string lora_base_name(const std::string& n) {
  NXD_CHECK(is_lora_name(n), "[lora] '", n, "' is not an adapter weight");
  return n.substr(0, n.size() - std::string("lora_A.weight").size()) + "weight";
}

std::vector<std::pair<std::string, Tensor>> lora_parameters(Module& root) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [n, t] : root.named_parameters())
    if (is_lora_name(n)) out.emplace_back(n, t);
  return out;
}

void merge_lora_weights(std::map<std::string, Tensor>& full, double scale) {
  NoGradGuard ng;
  std::vector<std::string> a_names;
  for (const auto& [n, t] : full)
    if (ends_with(n, "lora_A.weight")) a_names.push_back(n);
  for (const std::string& an : a_names) {
    const std::string stem = an.substr(0, an.size() - std::string("lora_A.weight").size());
    const std::string bn = stem + "lora_B.weight", wn = stem + "weight";
    NXD_CHECK(full.count(bn), "[merge_lora] '", an, "' has no '", bn, "'");
    NXD_CHECK(full.count(wn), "[merge_lora] adapter '", an, "' has no base weight '", wn, "'");
    const Tensor &a = full.at(an), &b = full.at(bn), &w = full.at(wn);
    NXD_CHECK_SHAPE(a.dim() == 2 && b.dim() == 2 && w.dim() == 2 && b.size(1) == a.size(0) &&
                        w.size(0) == b.size(0) && w.size(1) == a.size(1),
                    "[merge_lora] '", wn, "' ", w.desc(), " does not take B A of '", bn, "' ",
                    b.desc(), " and '", an, "' ", a.desc());
    Tensor merged =
        add(to(w, DType::f32), mul(matmul(to(b, DType::f32), to(a, DType::f32)), scale));
    full[wn] = to(merged, w.dtype());
  }
  for (auto it = full.begin(); it != full.end();)
    it = is_lora_name(it->first) ? full.erase(it) : std::next(it);
}

}  // namespace nxd

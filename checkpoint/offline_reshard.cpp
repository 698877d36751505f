// reshard_checkpoint (nxd-ckpt reshard): a checkpoint loaded at other degrees by load_checkpoint
// on sim ranks and saved again, so offline and online resharding are one code path.
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/layout.h"
#include "nxd/checkpoint/lora_files.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/moe/moe.h"
#include "nxd/optim/elementwise_optimizer.h"
#include "nxd/optim/zero1.h"
#include "nxd/pipeline/pipeline_model.h"

namespace nxd::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The saved optimizer's kind, options and groups over `params` (this rank's, in order). A
// parameter goes to the saved group that listed it; one no group listed (saved by another
// pipeline stage) goes by NxD's rule: "no_decay" for biases and norms, else "decay", else the
// first group. A ZeRO-1 checkpoint (`zero1`) gets a Zero1Optimizer (AdamW or Lion) over this rank's
// DP group, with master weights if the checkpoint has them, and the MoE experts (`experts`, at EP >
// 1) sharded over the expert-DP group, as a run's NxDOptimizer does.
struct OptimizerLayout {
  bool zero1 = false;
  std::vector<optim::NamedParam> experts;  // ZeRO-1 at EP > 1: sharded over expert DP
};
std::unique_ptr<optim::Optimizer> make_optimizer(const json& optimizer,
                                                 const std::vector<optim::NamedParam>& params,
                                                 const OptimizerLayout& layout) {
  const bool zero1 = layout.zero1;
  const json& info = optimizer.at("info");
  std::vector<optim::ParamGroup> groups;
  std::map<std::string, size_t> listed;
  for (const auto& g : info.at("groups")) {
    optim::ParamGroup pg;
    pg.name = g.at("name").get<std::string>();
    pg.lr = g.at("lr").get<double>();
    pg.weight_decay = g.at("weight_decay").get<double>();
    pg.lr_scale = g.at("lr_scale").get<double>();
    for (const auto& n : g.at("params")) listed[n.get<std::string>()] = groups.size();
    groups.push_back(std::move(pg));
  }
  if (groups.empty()) throw CheckpointError("[reshard] the optimizer has no parameter groups");
  auto by_name = [&](const char* name) -> size_t {
    for (size_t i = 0; i < groups.size(); ++i)
      if (groups[i].name == name) return i;
    return 0;
  };
  for (const auto& p : params) {
    const auto it = listed.find(p.name);
    const size_t gi = it != listed.end()
                          ? it->second
                          : by_name(optim::is_no_decay_param(p.name) ? "no_decay" : "decay");
    groups[gi].params.push_back(p);
  }
  groups.erase(std::remove_if(groups.begin(), groups.end(),
                              [](const optim::ParamGroup& g) { return g.params.empty(); }),
               groups.end());
  const std::string kind = info.at("kind").get<std::string>();
  const json o = info.value("options", json::object());
  // ZeRO-1 over `rule`, with master weights if the checkpoint has them
  auto zero1_over = [&](optim::AdamWOptions a, optim::ElementwiseRule rule) {
    for (const auto& [name, e] : optimizer.at("tensors").items())
      if (name.size() > 7 && name.compare(name.size() - 7, 7, ".master") == 0)
        a.precision.master_weights = true;
    optim::Zero1Options zo;
    zo.adamw = a;
    zo.rule = std::move(rule);
    zo.registration_order = params;
    zo.expert_params = layout.experts;
    if (layout.experts.empty()) zo.norm_groups.ep = nullptr;
    return std::make_unique<optim::Zero1Optimizer>(std::move(groups), zo);
  };
  if (kind == "AdamW") {
    optim::AdamWOptions a;
    a.beta1 = o.value("beta1", a.beta1);
    a.beta2 = o.value("beta2", a.beta2);
    a.eps = o.value("eps", a.eps);
    if (!zero1) return std::make_unique<optim::AdamW>(std::move(groups), a);
    return zero1_over(a, optim::adamw_rule(a));
  }
  if (kind == "Lion") {
    optim::LionOptions l;
    l.beta1 = o.value("beta1", l.beta1);
    l.beta2 = o.value("beta2", l.beta2);
    if (!zero1) return std::make_unique<optim::Lion>(std::move(groups), l);
    return zero1_over({}, optim::lion_rule(l));
  }
  if (kind == "SGD") {
    optim::SGDOptions s;
    s.momentum = o.value("momentum", s.momentum);
    s.dampening = o.value("dampening", s.dampening);
    s.nesterov = o.value("nesterov", s.nesterov);
    return std::make_unique<optim::SGD>(std::move(groups), s);
  }
  throw CheckpointError(str("[reshard] unknown optimizer kind '", kind, "'"));
}

// This rank's model at the current parallel_state: a whole CausalLM (pp 1) or a pipeline stage's
// chunks, its parameters in registration order and its MoE experts' among them.
struct LocalModel {
  std::shared_ptr<CausalLM> whole;
  std::unique_ptr<pipeline::PipelineModel> staged;
  std::vector<Module*> chunks;
  std::vector<optim::NamedParam> params, experts;
};
// A LoRA checkpoint (`lora` non-null) gets its adapters (their values come from the checkpoint).
LocalModel build_local_model(const ModelConfig& cfg, int pp, const LoraConfig* lora) {
  LocalModel m;
  if (pp == 1) {
    m.whole = make_causal_lm(cfg, 0);
    m.chunks = {m.whole.get()};
  } else {
    m.staged = std::make_unique<pipeline::PipelineModel>(cfg, 0);
    for (const auto& c : m.staged->chunks()) m.chunks.push_back(c.get());
  }
  if (lora)
    for (Module* c : m.chunks) apply_lora(*c, *lora, 0);
  if (pp == 1)
    for (const auto& [n, t] : m.whole->named_parameters()) m.params.push_back({n, t});
  else
    m.params = m.staged->local_named_parameters();
  if (lora)  // the optimizer holds the adapters only
    std::erase_if(m.params, [](const optim::NamedParam& p) { return !p.param.requires_grad(); });
  if (parallel_state::get_expert_model_parallel_size() > 1) {
    std::set<const TensorImpl*> is_expert;
    for (Module* c : m.chunks)
      for (const Tensor& t : moe_expert_parameters(*c)) is_expert.insert(t.impl());
    for (const auto& p : m.params)
      if (is_expert.count(p.param.impl())) m.experts.push_back(p);
  }
  return m;
}

}  // namespace

void reshard_checkpoint(const fs::path& tag_dir, const fs::path& out_root,
                        const ReshardDegrees& to) {
  const int tp = to.tp, dp = to.dp, pp = to.pp, ep = to.ep;
  const json meta = read_metadata(tag_dir);
  NXD_CHECK_T(ConfigError, tp >= 1 && dp >= 1 && pp >= 1 && ep >= 1,
              "[reshard] degrees must be >= 1, got tp=", tp, " pp=", pp, " dp=", dp, " ep=", ep);
  if (!meta.contains("model_config"))
    throw CheckpointError(str("[reshard] ", tag_dir.string(),
                              " records no model_config (not a CausalLM checkpoint)"));
  ModelConfig cfg = model_config_from_json(meta["model_config"]);
  cfg.kv_size_multiplier = std::max<int64_t>(1, tp / cfg.kv_heads());
  cfg.validate_parallel(tp);
  NXD_CHECK_T(ConfigError, ep == 1 || cfg.moe.enabled(), "[reshard] ep=", ep,
              " needs a mixture-of-experts model; ", tag_dir.string(), " holds a dense ", cfg.arch);
  NXD_CHECK_T(ConfigError, dp % ep == 0, "[reshard] ep=", ep, " does not divide dp=", dp,
              " (expert parallelism splits the data-parallel ranks)");
  if (cfg.moe.enabled()) cfg.moe.validate_parallel(ep);
  const std::string tag = tag_dir.filename().string();
  const fs::path dst = out_root / tag;
  std::error_code ec;
  if (fs::exists(dst, ec) || ec)
    throw CheckpointError(str("[reshard] ", dst.string(),
                              " exists already (not overwritten: choose another output folder)"));
  const bool has_optim = meta.contains("optimizer");
  std::optional<LoraConfig> lora;
  if (meta.contains("lora"))
    lora = lora_from_json(meta["lora"], (tag_dir / "metadata.json").string());
  const SavedLayout saved = saved_layout(meta);
  const fs::path src_root = tag_dir.parent_path();
  const bool has_sched = fs::exists(tag_dir / detail::kScheduler);
  sim::launch(tp * pp * dp, [&] {
    parallel_state::initialize_model_parallel({.tensor = tp, .pipeline = pp, .expert = ep});
    LocalModel m = build_local_model(cfg, pp, lora ? &*lora : nullptr);
    std::unique_ptr<optim::Optimizer> opt;
    if (has_optim)
      opt =
          make_optimizer(meta["optimizer"], m.params, {.zero1 = saved.zero1, .experts = m.experts});
    optim::LRSchedule sched({});
    const json user =
        load_checkpoint(src_root, m.chunks, opt.get(), has_sched ? &sched : nullptr, {.tag = tag});
    save_checkpoint(out_root, tag, std::vector<const Module*>(m.chunks.begin(), m.chunks.end()),
                    opt.get(), has_sched ? &sched : nullptr, user,
                    {.compress = saved.compressed, .step = meta.value("step", int64_t{0})});
  });
}

}  // namespace nxd::ckpt

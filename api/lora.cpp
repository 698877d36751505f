#include "nxd/api/lora.h"

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/runtime/error.h"

namespace nxd::api {

bool read_lora_config(const nlohmann::json& j, const std::string& where, LoraConfig& c) {
  NXD_CHECK_T(ConfigError, j.is_object(), "[lora] ", where, " must be a mapping, got ", j.dump());
  bool enabled = true;
  std::string at;
  try {
    for (const auto& [k, x] : j.items()) {
      at = k;
      if (k == "enable_lora") {
        enabled = x.get<bool>();
      } else if (k == "lora_rank") {
        c.lora_rank = x.get<int64_t>();
      } else if (k == "lora_alpha") {
        c.lora_alpha = x.get<double>();
      } else if (k == "lora_dropout") {
        c.lora_dropout = x.get<double>();
      } else if (k == "target_modules") {
        if (x.is_string())
          c.target_regex = x.get<std::string>();
        else
          c.target_modules = x.get<std::vector<std::string>>();
      } else if (k == "init_lora_weights") {
        const std::string v =
            x.is_boolean() ? (x.get<bool>() ? "default" : "") : x.get<std::string>();
        NXD_CHECK_T(ConfigError, v == "default" || v == "gaussian", "[lora] ", where,
                    "init_lora_weights must be default or gaussian, got ", x.dump());
        c.init_lora_weights =
            v == "gaussian" ? LoraConfig::Init::gaussian : LoraConfig::Init::standard;
      } else if (k == "use_rslora") {
        c.use_rslora = x.get<bool>();
      } else if (k == "merge_lora") {
        c.merge_lora = x.get<bool>();
      } else if (k == "bias" || k == "lora_bias") {
        NXD_CHECK_T(ConfigError, x.is_null() || x.get<std::string>() == "none", "[lora] ", where, k,
                    " ", x.dump(), ": nxd trains no biases with LoRA (only \"none\")");
      } else if (k == "lora_verbose" || k == "save_lora_base" || k == "load_lora_from_ckpt" ||
                 k == "lora_save_dir" || k == "lora_load_tag" || k == "merge_sharded_lora" ||
                 k == "save_lora_config_adapter") {
        // NxD's saving switches: nxd saves adapters with nxd-ckpt export-lora
      } else {
        throw ConfigError(str("[lora] unknown key '", where, k,
                              "' (known: enable_lora, lora_rank, lora_alpha, lora_dropout, "
                              "target_modules, init_lora_weights, use_rslora, merge_lora, bias)"));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(str("[lora] key '", where, at, "': ", e.what()));
  }
  if (enabled) c.validate();
  return enabled;
}

LoraSummary apply_lora_to_parts(const LoraConfig& cfg, const std::vector<Module*>& parts,
                                uint64_t seed) {
  std::vector<LoraReport> reports;
  LoraSummary s;
  for (Module* p : parts) {
    reports.push_back(apply_lora(*p, cfg, seed));
    if (dynamic_cast<CausalLM*>(p))
      for (const std::string& n : reports.back().adapted)
        NXD_CHECK_T(ConfigError, n != "lm_head" && n != "embed_out",
                    "[lora] target_modules selects the output head '", n,
                    "': a decoder model's logits read its weight directly, so nxd adapts only "
                    "the decoder layers' projections");
    s.adapted += static_cast<int64_t>(reports.back().adapted.size());
    s.trainable += reports.back().trainable;
    s.total += reports.back().total;
  }
  if (parallel_state::model_parallel_is_initialized() &&
      parallel_state::get_pipeline_model_parallel_size() > 1) {
    // an entry may match on another stage only (lm_head on the last)
    std::vector<double> n;
    for (const LoraReport& r : reports)
      for (const auto& [e, k] : r.entry_matches) n.push_back(static_cast<double>(k));
    if (!n.empty())
      parallel_state::get_pipeline_model_parallel_group().all_reduce(
          n.data(), n.data(), static_cast<int64_t>(n.size()), DType::f64, ReduceOp::sum);
    size_t i = 0;
    for (LoraReport& r : reports)
      for (auto& [e, k] : r.entry_matches) k = static_cast<int64_t>(n[i++]);
  }
  check_lora_matches(cfg, reports, parts);
  return s;
}

}  // namespace nxd::api

#include "nxd/train_app/init_from.h"

#include <filesystem>
#include <optional>
#include <set>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/io/bounded_read.h"
#include "nxd/runtime/error.h"

namespace nxd::train_app {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The model.* keys a source decides, with its values.
std::vector<std::pair<std::string, json>> source_keys(const ModelConfig& m) {
  std::vector<std::pair<std::string, json>> k = {
      {"model.arch", m.arch},
      {"model.vocab_size", m.vocab_size},
      {"model.num_layers", m.num_layers},
      {"model.hidden_size", m.hidden_size},
      {"model.num_attention_heads", m.num_attention_heads},
      {"model.num_kv_heads", m.kv_heads()},
      {"model.ffn_hidden_size", m.ffn_size()},
      {"model.max_position_embeddings", m.max_position_embeddings},
      {"model.rope_theta", m.rope_theta},
      {"model.norm_eps", m.norm_eps},
      {"model.tie_word_embeddings", m.tie_word_embeddings}};
  if (m.arch == "gpt_neox") k.emplace_back("model.rotary_pct", m.rotary_pct);
  // a mixture-of-experts source's experts (a Mixtral folder's num_local_experts and
  // num_experts_per_tok): its weights depend on them; a dense source has none
  k.emplace_back("model.moe.num_experts", m.moe.num_experts);
  if (m.moe.enabled()) {
    k.emplace_back("model.moe.top_k", m.moe.top_k);
    k.emplace_back("model.moe.frequency", m.moe.frequency);
  }
  return k;
}

bool same(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

// A checkpoint without optimizer and trainer state cannot be resumed: say what to do instead.
void check_resume_source(const Config& c) {
  if (c.is_null("exp_manager.resume_from_checkpoint")) return;
  const std::string p = c.get_string("exp_manager.resume_from_checkpoint");
  if (p.empty()) return;
  const auto use_init = [&](const std::string& what) {
    throw ConfigError(str("[config] exp_manager.resume_from_checkpoint=", p, " is ", what,
                          ": resuming needs the optimizer and trainer state of a run's checkpoint; "
                          "to start from these weights with a fresh optimizer at step 0 set "
                          "model.init_from=",
                          p, " instead"));
  };
  if (io::is_hf_folder(p)) use_init("a transformers folder");
  if (fs::is_regular_file(p)) use_init("a file (an exported model)");
  fs::path tag;
  try {
    tag = ckpt::resolve_checkpoint(p);
  } catch (const UserError&) {
    return;  // the trainer says what is wrong with it
  }
  const json meta = ckpt::read_metadata(tag);
  if (!meta.contains("optimizer"))
    use_init(str("a model-only checkpoint (", tag.string(),
                 " has no optimizer state; nxd-ckpt import and import-hf write these)"));
}

}  // namespace

// trainer.max_steps=0 (--eval) evaluates weights that come from somewhere, on a validation split.
void check_eval(const Config& c) {
  if (c.get_int("trainer.max_steps") != 0) return;
  if (!(c.get_double("data.val_fraction") > 0))
    throw ConfigError(
        "[config] trainer.max_steps=0 (--eval) evaluates on the validation split, but "
        "data.val_fraction=0 holds none out");
  const bool init = !c.is_null("model.init_from") && !c.get_string("model.init_from").empty();
  const bool resume = !c.is_null("exp_manager.resume_from_checkpoint") &&
                      !c.get_string("exp_manager.resume_from_checkpoint").empty();
  const bool if_exists =
      c.get_bool("exp_manager.resume_if_exists") &&
      ckpt::has_checkpoint(fs::path(c.get_string("exp_manager.exp_dir")) / "checkpoints");
  if (!init && !resume && !if_exists)
    throw ConfigError(
        "[config] trainer.max_steps=0 (--eval) evaluates existing weights: set model.init_from "
        "or exp_manager.resume_from_checkpoint (or resume_if_exists with checkpoints in "
        "exp_dir)");
}

namespace {

// Every model.* key the source decides takes its value when the run does not give it; a value
// given (also one equal to the key's default) that differs is an error naming both.
void apply_source_keys(Config& c, const ckpt::WeightSource& src, const std::string& via) {
  const std::string from = str(via, " (", src.path.string(), ")");
  for (const auto& [key, v] : source_keys(src.config)) {
    const json& cur = c.get(key);
    if (same(cur, v)) continue;
    if (!c.is_given(key)) {
      c.set(key, v, from);
      continue;
    }
    // no weight depends on the context length: a run may train longer (or shorter) sequences
    if (key == "model.max_position_embeddings") continue;
    throw ConfigError(str("[config] ", key, "=", cur.dump(), " contradicts ", via, ": ",
                          src.description, " has ", key.substr(6), "=", v.dump(),
                          " (leave the key unset to take the source's value)"));
  }
}

// The checkpoint a run resumes from, if there is one that records its model.
std::optional<ckpt::WeightSource> resume_source(const Config& c) {
  std::string p;
  if (!c.is_null("exp_manager.resume_from_checkpoint"))
    p = c.get_string("exp_manager.resume_from_checkpoint");
  if (p.empty() && c.get_bool("exp_manager.resume_if_exists")) {
    const fs::path d = fs::path(c.get_string("exp_manager.exp_dir")) / "checkpoints";
    if (ckpt::has_checkpoint(d)) p = d.string();
  }
  if (p.empty()) return std::nullopt;
  try {
    ckpt::WeightSource s = ckpt::inspect_weight_source(p);
    if (s.kind == ckpt::WeightSource::Kind::checkpoint) return s;
  } catch (const UserError&) {
  }
  return std::nullopt;  // the trainer says what is wrong with it
}

}  // namespace

namespace {

// model.model_config (NxD Training's architecture source): a transformers config.json, or its
// folder, read as a model without weights. Its values fill the model.* keys left at their
// defaults; keys the configuration sets win (NxD Training overrides config.json with them).
std::optional<ModelConfig> apply_model_config(Config& c) {
  if (c.is_null("model.model_config") || c.get_string("model.model_config").empty())
    return std::nullopt;
  const std::string p = c.get_string("model.model_config");
  ModelConfig m;
  try {
    m = fs::is_directory(p)
            ? ckpt::read_hf_config(p)
            : ckpt::model_config_from_hf(io::read_json_file(p, "config.json", "model_config"));
    m.name_or_path = p;
  } catch (const UserError& e) {
    throw ConfigError(str("[config] model.model_config=", p, ": ", e.what()));
  }
  for (const auto& [key, v] : source_keys(m))
    if (c.get(key) == find_key(key)->default_value)
      c.set(key, v, str("model.model_config (", p, ")"));
  m.hidden_size = c.get_int("model.hidden_size");  // the keys that won, for what no key says
  m.num_attention_heads = c.get_int("model.num_attention_heads");
  return m;
}

}  // namespace

InitFromSection resolve_init_from(Config& c) {
  check_resume_source(c);
  check_eval(c);
  InitFromSection s;
  const std::optional<ModelConfig> arch = apply_model_config(c);
  if (c.is_null("model.init_from") || c.get_string("model.init_from").empty()) {
    s.model = arch;  // what no key says (head_dim, biases, sliding window, ...)
    if (auto r = resume_source(c)) {
      apply_source_keys(c, *r, "exp_manager.resume_from_checkpoint");
      s.model = r->config;  // what no key says (rope_scaling, head_dim, ...); path stays "": the
                            // trainer's resume loads the weights
    }
    return s;
  }
  s.path = c.get_string("model.init_from");
  ckpt::WeightSource src;
  try {
    src = ckpt::inspect_weight_source(s.path);
  } catch (const UserError& e) {
    throw ConfigError(str("[config] model.init_from=", s.path, ": ", e.what()));
  }
  s.model = src.config;
  s.description = src.description;
  apply_source_keys(c, src, "model.init_from");
  return s;
}

std::vector<std::string> load_init_weights(const TrainConfig& cfg,
                                           const std::vector<Module*>& modules, bool whole) {
  std::vector<std::string> notes;
  if (cfg.init.path.empty()) return notes;
  const ckpt::WeightSource src = ckpt::inspect_weight_source(cfg.init.path);
  const auto full = ckpt::read_source_weights(src, &notes);
  std::set<std::string> used;
  ckpt::load_full_tensors(modules, full, src.description, {.used = &used});
  if (whole && used.size() != full.size())
    for (const auto& [n, t] : full)
      if (!used.count(n))
        throw ConfigError(str("[init_from] ", src.description, ": tensor '", n,
                              "' is not a parameter of the model (", t.desc(), ")"));
  return notes;
}

}  // namespace nxd::train_app

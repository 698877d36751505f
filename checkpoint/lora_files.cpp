#include "nxd/checkpoint/lora_files.h"

#include <fstream>
#include <set>
#include <sstream>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/io/fileio.h"
#include "nxd/io/safetensors.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace nxd::ckpt {

namespace {
const std::string kPeftPrefix = "base_model.model.";
}

json lora_json(const LoraConfig& c) {
  json j = {{"r", c.lora_rank},
            {"lora_alpha", c.lora_alpha},
            {"lora_dropout", c.lora_dropout},
            {"use_rslora", c.use_rslora},
            {"merge_lora", c.merge_lora}};
  if (c.target_regex.empty())
    j["target_modules"] = c.target_modules;
  else
    j["target_modules"] = c.target_regex;
  return j;
}

LoraConfig lora_from_json(const json& j, const std::string& where) {
  LoraConfig c;
  std::string at;
  try {
    if (!j.is_object()) throw CheckpointError(str("[lora] ", where, " is not an object"));
    at = "r";
    c.lora_rank = j.at("r").get<int64_t>();
    at = "lora_alpha";
    c.lora_alpha = j.at("lora_alpha").get<double>();
    at = "lora_dropout";
    c.lora_dropout = j.value("lora_dropout", 0.0);
    at = "use_rslora";
    c.use_rslora = j.value("use_rslora", false);
    at = "merge_lora";
    c.merge_lora = j.value("merge_lora", false);
    at = "target_modules";
    const json& tm = j.at("target_modules");
    if (tm.is_string())
      c.target_regex = tm.get<std::string>();
    else
      c.target_modules = tm.get<std::vector<std::string>>();
  } catch (const json::exception& e) {
    throw CheckpointError(str("[lora] ", where, ": key '", at, "': ", e.what()));
  }
  if (c.lora_rank < 1 || !(c.lora_alpha > 0))
    throw CheckpointError(str("[lora] ", where, ": r ", c.lora_rank, " and lora_alpha ",
                              c.lora_alpha, " must be positive"));
  return c;
}

void write_peft_adapter(const fs::path& dir, const PeftAdapter& a) {
  std::set<std::string> layers;  // the adapted layers' last names (PEFT's target_modules)
  std::vector<std::pair<std::string, Tensor>> named;
  for (const auto& [n, t] : a.tensors) {
    NXD_CHECK(is_lora_name(n), "[lora] '", n, "' is not an adapter weight");
    const std::string layer = n.substr(0, n.rfind(".lora_"));
    layers.insert(layer.substr(layer.rfind('.') + 1));
    named.emplace_back(kPeftPrefix + n, t);
  }
  const LoraConfig& c = a.config;
  const json cfg = {{"peft_type", "LORA"},
                    {"task_type", "CAUSAL_LM"},
                    {"r", c.lora_rank},
                    {"lora_alpha", c.lora_alpha},
                    {"lora_dropout", c.lora_dropout},
                    {"use_rslora", c.use_rslora},
                    {"target_modules", std::vector<std::string>(layers.begin(), layers.end())},
                    {"bias", "none"},
                    {"fan_in_fan_out", false},
                    {"inference_mode", true},
                    {"init_lora_weights", true},
                    {"modules_to_save", nullptr},
                    {"base_model_name_or_path", nullptr}};
  fs::create_directories(dir);
  io::write_safetensors(dir / "adapter_model.safetensors", named, {{"format", "pt"}});
  io::write_file_atomic(dir / "adapter_config.json", cfg.dump(2) + "\n");
}

PeftAdapter read_peft_adapter(const fs::path& dir) {
  const fs::path cf = dir / "adapter_config.json", wf = dir / "adapter_model.safetensors";
  for (const fs::path& f : {cf, wf})
    if (!fs::is_regular_file(f))
      throw CheckpointError(str("[lora] ", dir.string(), " is not a PEFT adapter folder: no ",
                                f.filename().string()));
  json j;
  try {
    std::ifstream in(cf);
    std::stringstream ss;
    ss << in.rdbuf();
    j = json::parse(ss.str());
  } catch (const std::exception& e) {
    throw CheckpointError(str("[lora] ", cf.string(), ": ", e.what()));
  }
  auto refuse = [&](const std::string& what) {
    throw CheckpointError(str("[lora] ", cf.string(), ": ", what, " (nxd applies plain LoRA)"));
  };
  if (j.value("peft_type", std::string("LORA")) != "LORA")
    refuse(str("peft_type ", j["peft_type"].dump()));
  if (j.value("use_dora", false)) refuse("use_dora true");
  if (j.value("fan_in_fan_out", false)) refuse("fan_in_fan_out true");
  if (j.contains("bias") && j["bias"] != "none") refuse(str("bias ", j["bias"].dump()));
  if (j.contains("modules_to_save") && !j["modules_to_save"].is_null() &&
      !j["modules_to_save"].empty())
    refuse(str("modules_to_save ", j["modules_to_save"].dump()));
  if (j.contains("rank_pattern") && !j["rank_pattern"].empty())
    refuse(str("rank_pattern ", j["rank_pattern"].dump()));
  if (j.contains("alpha_pattern") && !j["alpha_pattern"].empty())
    refuse(str("alpha_pattern ", j["alpha_pattern"].dump()));
  PeftAdapter a;
  a.config = lora_from_json(j, cf.string());
  NoGradGuard ng;
  for (auto& [n, t] : io::SafetensorsReader(wf).read_all()) {
    if (n.rfind(kPeftPrefix, 0) != 0 || !is_lora_name(n))
      throw CheckpointError(str("[lora] ", wf.string(), ": tensor '", n,
                                "' is not a LoRA weight under base_model.model. (lora_A/lora_B)"));
    std::string name = n.substr(kPeftPrefix.size());
    // PEFT keeps the adapter name in memory (lora_A.default.weight) but not in the file
    a.tensors[name] = t.dtype() == DType::f32 ? t : t.to(DType::f32);
  }
  if (a.tensors.empty()) throw CheckpointError(str("[lora] ", wf.string(), " holds no tensors"));
  return a;
}

void merge_adapter(std::map<std::string, Tensor>& full, const PeftAdapter& a,
                   const std::string& source) {
  for (const auto& [n, t] : a.tensors) {
    const std::string base = lora_base_name(n);
    if (!full.count(base))
      throw CheckpointError(str("[lora] ", source, ": adapter '", n, "' adapts '", base,
                                "', which the model does not have"));
    full[n] = t;
  }
  try {
    merge_lora_weights(full, a.config.scale());
  } catch (const InvalidArgument& e) {
    throw CheckpointError(str("[lora] ", source, ": ", e.what()));
  }
}

std::map<std::string, Tensor> read_model_and_adapter(const fs::path& tag_dir,
                                                     PeftAdapter* adapter) {
  const json meta = read_metadata(tag_dir);
  std::map<std::string, Tensor> full;
  for (auto& [n, t] : read_merged_model(tag_dir)) full[n] = t;
  if (!adapter || !meta.contains("lora")) return full;
  adapter->config = lora_from_json(meta["lora"], (tag_dir / "metadata.json").string() + " lora");
  for (auto it = full.begin(); it != full.end();) {
    if (!is_lora_name(it->first)) {
      ++it;
      continue;
    }
    adapter->tensors[it->first] = it->second;
    it = full.erase(it);
  }
  return full;
}

void export_lora(const fs::path& tag_dir, const fs::path& out_dir) {
  PeftAdapter a;
  read_model_and_adapter(tag_dir, &a);
  if (a.tensors.empty())
    throw CheckpointError(str("[export-lora] ", tag_dir.string(), " has no LoRA adapters"));
  write_peft_adapter(out_dir, a);
}

}  // namespace nxd::ckpt

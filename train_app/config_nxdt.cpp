// NxD Training's YAML files as they are: OmegaConf interpolations resolved, NxD Training's names
// mapped onto nxd's keys, and the keys that only mean something on Neuron hardware or XLA taken
// out and listed (docs/design/families.md, "NxD Training YAML files").
#include <algorithm>

#include "nxd/io/bounded_read.h"
#include "nxd/runtime/error.h"
#include "nxd/train_app/config.h"

namespace nxd::train_app {

using json = nlohmann::json;
using io::shorten;

namespace {

// Keys (and sections: every key under them) that configure the Neuron compiler, runtime, XLA,
// the PyTorch Lightning launcher or file formats nxd does not write; accepted and listed.
const std::vector<std::string>& not_applicable_keys() {
  static const std::vector<std::string> k = {
      "name",  // the experiment's name (NeMo's), used only in NxD Training's paths
      "compiler_flags", "compiler_cache_url", "aync_exec_max_inflight_requests",
      "async_exec_max_inflight_requests", "bucket_size_collectives", "neuron_rt_exec_timeout",
      "neuron_experimental_compress_rg",
      // the launcher's world: nxd's is backend.world_size (or mpirun's)
      "trainer.devices", "trainer.num_nodes", "trainer.lnc", "trainer.sequential_move_factor",
      "exp_manager.log_local_rank_0_only", "exp_manager.explicit_log_dir", "exp_manager.name",
      "exp_manager.log_parameter_norm", "exp_manager.log_gradient_norm",
      "exp_manager.enable_recovery_time_instrumentation", "exp_manager.save_xser",
      "exp_manager.load_xser", "exp_manager.ckpt_ptl_version",
      "exp_manager.checkpoint_callback_params.filename",
      "exp_manager.checkpoint_callback_params.model_parallel_size",
      // Neuron kernels and layouts of the same math
      "model.qkv_linear", "model.fuse_qkv", "model.use_cpu_initialization", "model.fusions",
      "model.optim.capturable", "precision.xla_use_bf16", "precision.xla_downcast_bf16",
      "precision.neuron_rt_stochastic_rounding_en", "model_alignment_strategy.peft.lora_verbose",
      "model_alignment_strategy.peft.save_lora_base",
      "model_alignment_strategy.peft.save_lora_config_adapter",
      "model_alignment_strategy.peft.merge_sharded_lora"};
  return k;
}

bool under(const std::string& key, const std::string& section) {
  return key == section ||
         (key.size() > section.size() && key.compare(0, section.size(), section) == 0 &&
          key[section.size()] == '.');
}

// Keys nxd accepts only at the value that is what it does anyway (anything else would be run
// differently: a ConfigError naming the key, the value and what nxd does).
struct Fixed {
  std::string key;
  std::vector<json> values;
  std::string nxd_does;
};
const std::vector<Fixed>& fixed_keys() {
  static const std::vector<Fixed> f = {
      {"model_source", {"hf"}, "transformers' model and tensor names"},
      {"trainer.check_val_every_n_epoch", {nullptr}, "validation by steps (val_check_interval)"},
      {"trainer.num_sanity_val_steps", {0}, "no sanity validation before training"},
      {"trainer.limit_test_batches", {0, 0.0}, "no test loop"},
      {"exp_manager.resume_ignore_no_checkpoint",
       {true},
       "resume_if_exists without a checkpoint starts fresh"},
      {"model.activations_checkpoint_recompute",
       {json::array({"CoreAttention"})},
       "selective recomputation of the attention core"},
      {"model.weight_init_only", {true, false}, ""},
      {"model_alignment_strategy.peft.lora_bias", {"none"}, "adapters without biases"},
      {"model_alignment_strategy.peft.load_lora_from_ckpt",
       {false},
       "adapters start fresh (model.init_from loads a base model)"}};
  return f;
}

bool same_value(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

void flatten(const json& node, const std::string& prefix,
             std::vector<std::pair<std::string, json>>& out) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string k = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object() && !it->empty())
      flatten(*it, k, out);
    else
      out.emplace_back(k, *it);
  }
}

struct Interpolator {
  const std::vector<std::pair<std::string, json>>& flat;
  const std::string& source;

  const json* find(const std::string& k) const {
    for (const auto& [key, v] : flat)
      if (key == k) return &v;
    return nullptr;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ConfigError(str("[config] ", key, " (", source, "): ", what));
  }
  // One ${...} body: a dotted key of the file, or NxD Training's resolver multiply:a, b.
  json reference(const std::string& key, const std::string& body, int depth) const {
    if (body.rfind("multiply:", 0) == 0) {
      std::vector<std::string> args;
      std::string cur;
      int level = 0;
      for (char c : body.substr(9)) {
        if (c == '{') ++level;
        if (c == '}') --level;
        if (c == ',' && level == 0) {
          args.push_back(cur);
          cur.clear();
        } else {
          cur += c;
        }
      }
      args.push_back(cur);
      double p = 1;
      bool integral = true;
      for (std::string a : args) {
        a.erase(0, a.find_first_not_of(' '));
        a.erase(a.find_last_not_of(' ') + 1);
        json v;
        if (a.rfind("${", 0) == 0) {
          v = value(key, json(a), depth + 1);
        } else {
          try {
            v = json::parse(a);
          } catch (const json::exception&) {
            fail(key, str("multiply of '", shorten(a), "'"));
          }
        }
        if (!v.is_number()) fail(key, str("multiply of a non-number ", shorten(v.dump())));
        integral = integral && v.is_number_integer();
        p *= v.get<double>();
      }
      return integral ? json(static_cast<int64_t>(p)) : json(p);
    }
    if (body.find(':') != std::string::npos)
      fail(key, str("the interpolation resolver '${", shorten(body),
                    "}' is not one nxd knows (multiply is)"));
    const json* v = find(body);
    if (!v) fail(key, str("'${", shorten(body), "}' names no key of the file"));
    return value(body, *v, depth + 1);
  }
  // A value with its interpolations resolved: "${x}" alone keeps x's type, inside text its text.
  json value(const std::string& key, const json& v, int depth) const {
    if (depth > 16) fail(key, "interpolations nest too deep (a cycle?)");
    if (!v.is_string()) return v;
    const std::string s = v.get<std::string>();
    const size_t b = s.find("${");
    if (b == std::string::npos) return v;
    int level = 0;
    size_t e = b;
    for (; e < s.size(); ++e) {
      if (s[e] == '{') ++level;
      if (s[e] == '}' && --level == 0) break;
    }
    if (e >= s.size()) fail(key, str("unclosed interpolation in '", shorten(s), "'"));
    const json r = reference(key, s.substr(b + 2, e - b - 2), depth);
    if (b == 0 && e + 1 == s.size()) return r;
    const std::string text = r.is_string() ? r.get<std::string>() : r.dump();
    return value(key, s.substr(0, b) + text + s.substr(e + 1), depth + 1);
  }
};

}  // namespace

std::string nxdt_reference_markdown() {
  std::string s =
      "\n## NxD Training's YAML files\n\n"
      "NxD Training's example configurations load as they are. OmegaConf interpolations are "
      "resolved\n(`${dotted.key}` of the file, `${multiply:a, b}`); NxD Training's names map "
      "onto the keys above:\n`model.encoder_seq_length` is `data.seq_length` (unless the file "
      "sets that), `data.tokenizer.type`\nis `data.tokenizer` (a folder: its tokenizer.json), "
      "`trainer.max_epochs: -1` is null, `exp_manager.exp_dir:\nnull` the default, and "
      "`exp_manager.resume_from_checkpoint` with `model.weight_init_only: True` is\n"
      "`model.init_from`. These keys are accepted only at the value nxd runs anyway (another "
      "value is an\nerror naming the key):";
  for (const auto& f : fixed_keys()) {
    std::string vs;
    for (const auto& a : f.values) vs += (vs.empty() ? "" : " or ") + a.dump();
    s += str(" `", f.key, "` (", vs, ")", &f == &fixed_keys().back() ? "." : ";");
  }
  s += "\nThese only mean something on Neuron hardware, XLA or NxD Training's launcher and file "
       "formats: they\nare accepted, ignored, and listed once in the run's output as \"not "
       "applicable in nxd\" (a name\nending in a section means every key under it):";
  for (const auto& k : not_applicable_keys())
    s += str(" `", k, "`", &k == &not_applicable_keys().back() ? "." : ",");
  s += "\nSo are `precision.master_weights` and `precision.fp32_grad_acc` unless `precision.type` "
       "is `manual`\n(NxD Training derives them from the type, as nxd does). Any other unknown "
       "key is an error naming it\nand the nearest known key.\n";
  return s;
}

json nxdt_tree(const json& tree, const std::string& source, std::vector<std::string>& na) {
  std::vector<std::pair<std::string, json>> flat;
  flatten(tree, "", flat);
  std::vector<std::pair<std::string, json>> kept;
  for (auto& [k, v] : flat) {
    const auto& n = not_applicable_keys();
    if (std::any_of(n.begin(), n.end(), [&](const std::string& s) { return under(k, s); })) {
      if (std::find(na.begin(), na.end(), k) == na.end()) na.push_back(k);
      continue;
    }
    kept.emplace_back(k, v);
  }
  // NxD Training sets master_weights and fp32_grad_acc from precision.type unless it is manual
  // (which nxd does not have): the file's values are not what runs, nxd derives them likewise
  const auto type = std::find_if(kept.begin(), kept.end(),
                                 [](const auto& kv) { return kv.first == "precision.type"; });
  if (type != kept.end() && type->second != "manual") {
    for (auto it = kept.begin(); it != kept.end();) {
      if (it->first == "precision.master_weights" || it->first == "precision.fp32_grad_acc") {
        if (std::find(na.begin(), na.end(), it->first) == na.end()) na.push_back(it->first);
        it = kept.erase(it);
      } else {
        ++it;
      }
    }
  }
  const Interpolator ip{flat, source};
  json out = json::object();
  auto has = [&](const std::string& k) {
    return std::any_of(kept.begin(), kept.end(), [&](const auto& kv) { return kv.first == k; });
  };
  for (const auto& [k, v0] : kept) {
    const json v = ip.value(k, v0, 0);
    const auto& f = fixed_keys();
    const auto fx = std::find_if(f.begin(), f.end(), [&](const Fixed& x) { return x.key == k; });
    if (fx != f.end()) {
      if (std::none_of(fx->values.begin(), fx->values.end(),
                       [&](const json& a) { return same_value(a, v); })) {
        std::string vs;
        for (const auto& a : fx->values) vs += (vs.empty() ? "" : " or ") + a.dump();
        throw ConfigError(str("[config] ", k, "=", shorten(v.dump()), " (", source,
                              ") is not supported: nxd accepts ", vs, " (", fx->nxd_does, ")"));
      }
      continue;
    }
    if (k == "trainer.max_epochs" && same_value(v, -1)) {
      out[k] = nullptr;  // PyTorch Lightning's -1: no limit
    } else if (k == "exp_manager.exp_dir" && v.is_null()) {
      continue;  // NxD Training's null: the default directory
    } else if (k == "model.encoder_seq_length") {
      // the training sequence length, unless the file also sets data.seq_length (SFT files do)
      if (!has("data.seq_length")) out["data.seq_length"] = v;
    } else if (k == "data.tokenizer.type") {
      out["data.tokenizer"] = v;  // a tokenizer folder (or its tokenizer.json)
    } else if (k == "exp_manager.resume_from_checkpoint" && !v.is_null() &&
               has("model.weight_init_only") &&
               ip.value("model.weight_init_only", *ip.find("model.weight_init_only"), 0) == true) {
      out["model.init_from"] = v;  // weight_init_only: its weights without optimizer state
    } else {
      out[k] = v;
    }
  }
  return out;
}

}  // namespace nxd::train_app

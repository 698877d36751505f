// The key registry, YAML/JSON merging, --set overrides, and resolution into TrainConfig.
#include "nxd/trainer/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include "nxd/layers/models/config.h"
#include "nxd/runtime/error.h"

namespace nxd::trainer {

using json = nlohmann::json;

const char* key_type_name(KeyType t) {
  switch (t) {
    case KeyType::integer:
      return "integer";
    case KeyType::number:
      return "number";
    case KeyType::boolean:
      return "boolean";
    case KeyType::string:
      return "string";
    case KeyType::number_list:
      return "list of numbers";
  }
  return "?";
}

namespace {

KeySpec key(std::string k, KeyType t, json def, std::string doc,
            std::vector<std::string> choices = {}, bool nullable = false, int64_t list_size = 0) {
  return KeySpec{std::move(k),       t,        std::move(def), std::move(doc),
                 std::move(choices), nullable, list_size};
}

std::vector<KeySpec> make_registry() {
  using K = KeyType;
  return {
      key("seed", K::integer, 1234,
          "Seed of everything random: parameter init, data shuffling and split, sampling."),
      key("exp_manager.exp_dir", K::string, "nxd_train_out",
          "Output directory (metrics.csv, config.yaml); `--out DIR` sets it."),
      // trainer
      key("trainer.max_steps", K::integer, 700, "Optimizer steps to run."),
      key("trainer.log_every_n_steps", K::integer, 10,
          "A metrics.csv row and progress update every N steps (and at the last step)."),
      key("trainer.val_check_interval", K::integer, 100,
          "Validation loss every N steps, and at the last step; 0 = never."),
      key("trainer.limit_val_batches", K::integer, 8,
          "Micro batches per validation (a fixed set, the same every time); capped by the "
          "validation split's size."),
      key("trainer.gradient_clip_val", K::number, 1.0,
          "Clip the global L2 gradient norm to this value; 0 = no clipping."),
      key("trainer.num_threads", K::integer, 0,
          "Compute (BLAS) threads; 0 = NXD_NUM_THREADS if set, else every core. The sim backend "
          "with several ranks runs each rank's BLAS on one thread (the ranks are the threads)."),
      key("trainer.matmul_precision", K::string, "bf16",
          "Matrix products of f32 tensors: `bf16`: inputs rounded to bf16, products accumulated "
          "in f32 (what neuronx-cc's default `--auto-cast matmult --auto-cast-type bf16` does on "
          "a NeuronCore; PyTorch's float32 matmul precision \"medium\"), or `fp32`. Weights, "
          "gradients and optimizer state stay f32.",
          {"fp32", "bf16"}),
      // data
      key("data.kind", K::string, "text",
          "`text`: byte-level tokens (vocab 256) of a text file or of every text file under a "
          "folder; `tokens`: a pre-tokenized binary file; `random`: uniform random tokens "
          "(benchmarks).",
          {"text", "tokens", "random"}),
      key("data.path", K::string, "/usr/share/games/fortunes",
          "The text file or folder (`text`), or the token file (`tokens`). Folders are read "
          "recursively in sorted order; files that are not text (NUL bytes, invalid UTF-8) are "
          "skipped with a note."),
      key("data.token_dtype", K::string, "uint16",
          "Element type of a `tokens` file (little-endian).", {"uint16", "uint32"}),
      key("data.seq_length", K::integer, 128, "Tokens per sample."),
      key("data.micro_batch_size", K::integer, nullptr,
          "Samples per forward/backward pass on one rank. null = global_batch_size / data-parallel "
          "size (no gradient accumulation).",
          {}, true),
      key("data.global_batch_size", K::integer, 16,
          "Samples per optimizer step: micro_batch_size x gradient-accumulation steps x "
          "data-parallel size."),
      key("data.val_fraction", K::number, 0.05,
          "Fraction of the samples held out for validation (chosen by the seed)."),
      key("data.shuffle", K::boolean, true,
          "Shuffle the training samples every epoch (deterministically from the seed)."),
      key("data.random_num_samples", K::integer, 65536,
          "`random`: number of samples in the synthetic dataset."),
      // model
      key("model.arch", K::string, "llama", "Model family.", {"llama", "gpt_neox"}),
      key("model.vocab_size", K::integer, 256,
          "Vocabulary size; at least 256 for byte-level text, above every id of a token file."),
      key("model.num_layers", K::integer, 4, "Decoder layers."),
      key("model.hidden_size", K::integer, 192, "Model width."),
      key("model.num_attention_heads", K::integer, 4, "Attention heads; must divide hidden_size."),
      key("model.num_kv_heads", K::integer, nullptr,
          "Key/value heads (grouped-query attention, llama); must divide num_attention_heads. "
          "null = num_attention_heads.",
          {}, true),
      key("model.ffn_hidden_size", K::integer, nullptr,
          "MLP width. null = llama: 8/3 x hidden rounded up to a multiple of 256; gpt_neox: 4 x "
          "hidden.",
          {}, true),
      key("model.max_position_embeddings", K::integer, nullptr,
          "Longest sequence the model accepts. null = data.seq_length.", {}, true),
      key("model.rotary_pct", K::number, 0.25,
          "gpt_neox: fraction of each head's features that get rotary embeddings (llama: all)."),
      key("model.rope_theta", K::number, 10000.0, "Rotary base."),
      key("model.norm_eps", K::number, 1e-5, "RMSNorm (llama) / LayerNorm (gpt_neox) epsilon."),
      key("model.init_std", K::number, 0.02, "Std of the normal init of weights."),
      key("model.dropout", K::number, 0.0, "Dropout on attention and MLP outputs (training)."),
      key("model.tie_word_embeddings", K::boolean, false,
          "The output head reuses the input embedding."),
      // optimizer
      key("model.optim.name", K::string, "adamw",
          "Optimizer (`adamw_fp32OptState` is NxD Training's name for AdamW).",
          {"adamw", "adamw_fp32OptState", "sgd"}),
      key("model.optim.lr", K::number, 3e-3, "Peak learning rate."),
      key("model.optim.weight_decay", K::number, 0.01,
          "Decoupled weight decay; biases and norm weights get none (NxD's grouping)."),
      key("model.optim.betas", K::number_list, json::array({0.9, 0.99}), "AdamW (beta1, beta2).",
          {}, false, 2),
      key("model.optim.eps", K::number, 1e-8, "AdamW epsilon (added to sqrt(v_hat))."),
      key("model.optim.momentum", K::number, 0.0, "SGD momentum."),
      key("model.optim.nesterov", K::boolean, false, "SGD Nesterov momentum."),
      key("model.optim.sched.name", K::string, "cosine",
          "LR schedule after the warmup: constant, linear or cosine decay to min_lr "
          "(NxD Training's `LinearAnnealingWithWarmUp` and `CosineAnnealing` are accepted).",
          {"constant", "linear", "cosine", "LinearAnnealingWithWarmUp", "CosineAnnealing"}),
      key("model.optim.sched.warmup_steps", K::integer, nullptr,
          "Linear warmup from 0 to lr over this many steps. null = min(50, max_steps / 10).", {},
          true),
      key("model.optim.sched.max_steps", K::integer, nullptr,
          "Step where the decay reaches min_lr. null = trainer.max_steps.", {}, true),
      key("model.optim.sched.min_lr", K::number, 1e-4, "Floor of the decay."),
      // parallelism
      key("distributed_strategy.tensor_model_parallel_size", K::integer, 2,
          "Tensor-parallel degree: attention heads, kv heads x kv_replicator, ffn size and vocab "
          "must divide by it. Data-parallel degree = world size / this (no pipeline yet)."),
      key("distributed_strategy.sequence_parallel", K::boolean, true,
          "Split activations along the sequence between the tensor-parallel regions (TP > 1)."),
      key("distributed_strategy.kv_replicator", K::integer, nullptr,
          "K/V heads replicated this many times so TP can exceed model.num_kv_heads "
          "(NxD's kv_size_multiplier). null = max(1, TP / num_kv_heads).",
          {}, true),
      key("distributed_strategy.grad_bucket_mb", K::number, 25.0,
          "Data-parallel gradient all-reduce bucket size in MiB (reduced as buckets fill during "
          "the last micro batch's backward)."),
      // backend
      key("backend.kind", K::string, "sim",
          "sim: every rank a thread of this process on a simulated Neuron machine; mpi: one rank "
          "per process under mpirun (`mpirun -np N nxd-train --set backend.kind=mpi`).",
          {"sim", "mpi"}),
      key("backend.instance", K::string, "trn1.32xlarge",
          "sim: the modeled instance type (its NeuronCores, HBM and links give the modeled step "
          "time and memory)."),
      key("backend.world_size", K::integer, nullptr,
          "Ranks (NeuronCores). null = 8 (sim) or the MPI world (mpi). Must equal "
          "tensor_model_parallel_size x data-parallel size; 1 = plain single-rank training.",
          {}, true),
      key("backend.timeline", K::string, "",
          "sim: write every rank's modeled kernels and collectives to this file as a Chrome trace "
          "(opens in https://ui.perfetto.dev); it grows with every step, so use it on short runs. "
          "Empty = no trace."),
      // generation
      key("generation.prompt", K::string, "Q: What",
          "Prompt of the text sample printed after training."),
      key("generation.max_new_tokens", K::integer, 200, "Tokens to generate; 0 = no sample."),
      key("generation.temperature", K::number, 0.8, "Sampling temperature; 0 = greedy."),
      key("generation.top_k", K::integer, 40, "Sample among the k most likely tokens; 0 = all."),
  };
}

int64_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<int64_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int64_t>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int64_t>(i);
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string last_component(const std::string& k) {
  auto p = k.rfind('.');
  return p == std::string::npos ? k : k.substr(p + 1);
}

std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return str("boolean ", v.dump());
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return str("integer ", v.dump());
    case json::value_t::number_float:
      return str("number ", v.dump());
    case json::value_t::string:
      return str("string ", v.dump());
    case json::value_t::array:
      return str("list ", v.dump());
    case json::value_t::object:
      return "a mapping";
    default:
      return v.dump();
  }
}

bool is_section(const std::string& path) {
  const std::string pre = path + ".";
  for (const auto& k : config_keys())
    if (k.key.compare(0, pre.size(), pre) == 0) return true;
  return false;
}

[[noreturn]] void unknown_key(const std::string& k, const std::string& src) {
  throw ConfigError(str("[config] unknown key '", k, "' (", src, "); did you mean '",
                        nearest_key(k), "'? (nxd-train --help-config lists every key)"));
}

// Plain YAML scalar -> typed JSON value (YAML 1.2 core schema, plus yes/no as strings).
json plain_scalar(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  {
    int64_t v;
    const char* b = s.data();
    const char* e = b + s.size();
    if (*b == '+') ++b;
    auto r = std::from_chars(b, e, v);
    if (r.ec == std::errc() && r.ptr == e) return v;
  }
  {
    double v;
    const char* b = s.data();
    const char* e = b + s.size();
    if (*b == '+') ++b;
    auto r = std::from_chars(b, e, v);
    if (r.ec == std::errc() && r.ptr == e && s.find_first_of("0123456789") != std::string::npos)
      return v;
    if (s == ".inf" || s == ".Inf") return std::numeric_limits<double>::infinity();
    if (s == "-.inf" || s == "-.Inf") return -std::numeric_limits<double>::infinity();
  }
  return s;
}

json yaml_to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      if (n.Tag() == "!") return n.Scalar();  // quoted: always a string
      return plain_scalar(n.Scalar());
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& c : n) a.push_back(yaml_to_json(c));
      return a;
    }
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : n) o[kv.first.as<std::string>()] = yaml_to_json(kv.second);
      return o;
    }
  }
  return nullptr;
}

std::string format_number(double d) {
  if (std::isinf(d)) return d > 0 ? ".inf" : "-.inf";
  if (std::isnan(d)) return ".nan";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // stays a float when reloaded
  return s;
}

template <class J>
std::string yaml_scalar(const J& v) {
  if (v.is_null()) return "null";
  if (v.is_string()) return v.dump();  // a JSON string is a valid YAML double-quoted scalar
  if (v.is_number_float()) return format_number(v.template get<double>());
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + yaml_scalar(v[i]);
    return s + "]";
  }
  return v.dump();
}

void emit_yaml(std::ostringstream& os, const nlohmann::ordered_json& node, int indent) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    os << std::string(indent, ' ') << it.key() << ":";
    if (it->is_object()) {
      os << "\n";
      emit_yaml(os, *it, indent + 2);
    } else {
      os << " " << yaml_scalar(*it) << "\n";
    }
  }
}

}  // namespace

const std::vector<KeySpec>& config_keys() {
  static const std::vector<KeySpec> reg = make_registry();
  return reg;
}

const KeySpec* find_key(const std::string& k) {
  for (const auto& s : config_keys())
    if (s.key == k) return &s;
  return nullptr;
}

std::string nearest_key(const std::string& k) {
  std::string best;
  int64_t best_d = INT64_MAX;
  const std::string leaf = last_component(k);
  for (const auto& s : config_keys()) {
    // a right leaf under the wrong section ("trainer.seq_length") is a near miss too
    int64_t d = std::min(edit_distance(k, s.key), edit_distance(leaf, last_component(s.key)) + 1);
    if (s.key.compare(0, k.size(), k) == 0) d = std::min<int64_t>(d, 1);  // a truncated key
    if (d < best_d) best_d = d, best = s.key;
  }
  return best;
}

std::string config_reference_markdown() {
  std::ostringstream os;
  os << "# nxd-train configuration\n\n"
     << "Every key `nxd-train` accepts, with its type and default. This file is generated from "
        "the registry in\n`trainer/config.cpp` (`nxd-train --help-config`); a test checks they "
        "agree.\n\n"
     << "Keys follow NxD Training's YAML names. Set them in a YAML or JSON file (`--config "
        "FILE`, nested\nmappings or dotted keys) or on the command line (`--set "
        "model.optim.lr=3e-4`, the value read as a\nYAML scalar or flow list). Later sources "
        "win: defaults, then the file, then each `--set` in order,\nthen `--out DIR` "
        "(`exp_manager.exp_dir`). The resolved configuration is written to "
        "`DIR/config.yaml`,\nwhich `--config` reads back.\n\n"
     << "| key | type | default | description |\n|---|---|---|---|\n";
  for (const auto& s : config_keys()) {
    std::string type = key_type_name(s.type);
    if (!s.choices.empty()) {
      type = "one of ";
      for (size_t i = 0; i < s.choices.size(); ++i) type += (i ? ", " : "") + s.choices[i];
    }
    if (s.nullable) type += " or null";
    os << "| `" << s.key << "` | " << type << " | `" << yaml_scalar(s.default_value) << "` | "
       << s.doc << " |\n";
  }
  return os.str();
}

// ---- Config ----

Config::Config() {
  for (const auto& s : config_keys()) values_[s.key] = s.default_value;
}

json parse_yaml(const std::string& text, const std::string& source) {
  try {
    return yaml_to_json(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    throw ConfigError(str("[config] ", source, ":", e.mark.line + 1, ":", e.mark.column + 1,
                          ": YAML syntax error: ", e.msg));
  }
}

void Config::merge_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(str("[config] cannot read config file '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  json tree;
  const bool is_json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (is_json) {
    try {
      tree = json::parse(text);
    } catch (const json::parse_error& e) {
      throw ConfigError(str("[config] ", path, ": JSON syntax error: ", e.what()));
    }
  } else {
    tree = parse_yaml(text, path);
  }
  if (tree.is_null()) return;  // empty file
  if (!tree.is_object())
    throw ConfigError(str("[config] ", path, ": expected a mapping of keys at the top level, got ",
                          describe(tree)));
  merge_json(tree, path);
}

void Config::merge_json(const json& tree, const std::string& source) {
  NXD_CHECK_T(ConfigError, tree.is_object(), "[config] ", source, ": expected a mapping, got ",
              describe(tree));
  merge_node(tree, "", source);
}

void Config::merge_node(const json& node, const std::string& prefix, const std::string& src) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string k = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (find_key(k)) {
      set(k, *it, src);
    } else if (it->is_object()) {
      if (!is_section(k)) unknown_key(k, src);
      merge_node(*it, k, src);
    } else if (is_section(k)) {
      throw ConfigError(str("[config] '", k, "' is a section (", src,
                            "): expected a mapping of its keys, got ", describe(*it)));
    } else {
      unknown_key(k, src);
    }
  }
}

void Config::apply_override(const std::string& a) {
  const auto eq = a.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(str("[config] --set expects dotted.key=value, got '", a, "'"));
  const std::string k = a.substr(0, eq), text = a.substr(eq + 1);
  const std::string src = str("--set ", a);
  if (!find_key(k)) {
    if (is_section(k))
      throw ConfigError(str("[config] '", k, "' is a section (", src, "); set one of its keys"));
    unknown_key(k, src);
  }
  json v;
  if (find_key(k)->type == KeyType::string) {
    // a string key takes the text as written unless it is a quoted YAML string: prompts and
    // paths may look like numbers or contain ": "
    try {
      v = parse_yaml(text, src);
    } catch (const ConfigError&) {
    }
    if (!v.is_string()) v = text;
  } else {
    v = parse_yaml(text, src);
  }
  set(k, v, src);
}

void Config::set(const std::string& k, const json& value, const std::string& src) {
  const KeySpec* spec = find_key(k);
  if (!spec) unknown_key(k, src);
  auto wrong = [&](const char* expected) {
    throw ConfigError(
        str("[config] ", k, ": expected ", expected, ", got ", describe(value), " (", src, ")"));
  };
  json v = value;
  if (v.is_null()) {
    if (!spec->nullable) wrong(key_type_name(spec->type));
    values_[k] = v;
    return;
  }
  switch (spec->type) {
    case KeyType::integer:
      if (v.is_number_float()) {
        const double d = v.get<double>();
        if (std::floor(d) != d || std::abs(d) > 9e15) wrong("an integer");
        v = static_cast<int64_t>(d);
      } else if (!v.is_number_integer()) {
        wrong("an integer");
      }
      break;
    case KeyType::number:
      if (!v.is_number()) wrong("a number");
      v = v.get<double>();
      break;
    case KeyType::boolean:
      if (!v.is_boolean()) wrong("a boolean (true or false)");
      break;
    case KeyType::string:
      if (v.is_number() || v.is_boolean()) v = v.dump();  // YAML `prompt: 42` means "42"
      if (!v.is_string()) wrong("a string");
      if (!spec->choices.empty() && std::find(spec->choices.begin(), spec->choices.end(),
                                              v.get<std::string>()) == spec->choices.end()) {
        std::string c;
        for (size_t i = 0; i < spec->choices.size(); ++i) c += (i ? ", " : "") + spec->choices[i];
        throw ConfigError(
            str("[config] ", k, ": ", v.dump(), " is not one of ", c, " (", src, ")"));
      }
      break;
    case KeyType::number_list: {
      if (!v.is_array()) wrong(str("a list of ", spec->list_size, " numbers").c_str());
      if (spec->list_size > 0 && static_cast<int64_t>(v.size()) != spec->list_size)
        wrong(str("a list of ", spec->list_size, " numbers").c_str());
      json out = json::array();
      for (const auto& e : v) {
        if (!e.is_number()) wrong("a list of numbers");
        out.push_back(e.get<double>());
      }
      v = out;
      break;
    }
  }
  values_[k] = v;
}

const json& Config::get(const std::string& k) const {
  auto it = values_.find(k);
  if (it == values_.end()) throw InternalError(str("[config] internal: unknown key '", k, "'"));
  return it->second;
}

int64_t Config::get_int(const std::string& k) const {
  const json& v = get(k);
  NXD_INTERNAL_CHECK(v.is_number_integer(), "[config] ", k, " is ", v.dump());
  return v.get<int64_t>();
}
double Config::get_double(const std::string& k) const {
  const json& v = get(k);
  NXD_INTERNAL_CHECK(v.is_number(), "[config] ", k, " is ", v.dump());
  return v.get<double>();
}
bool Config::get_bool(const std::string& k) const {
  const json& v = get(k);
  NXD_INTERNAL_CHECK(v.is_boolean(), "[config] ", k, " is ", v.dump());
  return v.get<bool>();
}
std::string Config::get_string(const std::string& k) const {
  const json& v = get(k);
  NXD_INTERNAL_CHECK(v.is_string(), "[config] ", k, " is ", v.dump());
  return v.get<std::string>();
}
std::vector<double> Config::get_doubles(const std::string& k) const {
  return get(k).get<std::vector<double>>();
}

json Config::tree() const {
  json root = json::object();
  // registry order, so config.yaml reads like the docs
  for (const auto& s : config_keys()) {
    json* node = &root;
    std::string rest = s.key;
    for (auto p = rest.find('.'); p != std::string::npos; p = rest.find('.')) {
      node = &(*node)[rest.substr(0, p)];
      rest = rest.substr(p + 1);
    }
    (*node)[rest] = values_.at(s.key);
  }
  return root;
}

std::string Config::to_yaml() const {
  // registry order, so config.yaml reads like the docs (json objects would sort their keys)
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  for (const auto& s : config_keys()) {
    nlohmann::ordered_json* node = &root;
    std::string rest = s.key;
    for (auto p = rest.find('.'); p != std::string::npos; p = rest.find('.')) {
      node = &(*node)[rest.substr(0, p)];
      rest = rest.substr(p + 1);
    }
    (*node)[rest] = values_.at(s.key);
  }
  std::ostringstream os;
  emit_yaml(os, root, 0);
  return os.str();
}

// ---- resolution ----

constexpr int kDefaultSimWorld = 8;  // simulated NeuronCores of the default run

void check_world(int64_t world_size, int64_t tp) {
  if (world_size % tp != 0)
    throw ConfigError(str("[config] world size ", world_size, " is not tensor_model_parallel_size ",
                          tp, " x data-parallel size (pipeline size 1): ", world_size,
                          " does not divide by ", tp,
                          " (set backend.world_size or distributed_strategy."
                          "tensor_model_parallel_size)"));
}

ModelConfig model_config(const TrainConfig& cfg) {
  const auto& m = cfg.model;
  ModelConfig mc;
  mc.arch = m.arch;
  mc.vocab_size = m.vocab_size;
  mc.num_layers = m.num_layers;
  mc.hidden_size = m.hidden_size;
  mc.num_attention_heads = m.num_attention_heads;
  mc.num_kv_heads = m.num_kv_heads;
  mc.ffn_hidden_size = m.ffn_hidden_size;
  mc.max_position_embeddings = m.max_position_embeddings;
  mc.rotary_pct = m.rotary_pct;
  mc.rope_theta = m.rope_theta;
  mc.norm_eps = m.norm_eps;
  mc.init_std = m.init_std;
  mc.dropout = m.dropout;
  mc.tie_word_embeddings = m.tie_word_embeddings;
  mc.sequence_parallel = cfg.dist.sequence_parallel;
  mc.kv_size_multiplier = cfg.dist.kv_replicator;
  return mc;
}

TrainConfig resolve(const Config& in) {
  Config c = in;
  auto fail = [](auto&&... a) { throw ConfigError(str("[config] ", a...)); };
  auto positive = [&](const char* k) {
    const int64_t v = c.get_int(k);
    if (v <= 0) fail(k, " must be positive, got ", v);
    return v;
  };
  auto non_negative = [&](const char* k) {
    const int64_t v = c.get_int(k);
    if (v < 0) fail(k, " must be >= 0, got ", v);
    return v;
  };
  TrainConfig t;
  t.seed = static_cast<uint64_t>(c.get_int("seed"));
  t.out_dir = c.get_string("exp_manager.exp_dir");
  if (t.out_dir.empty()) fail("exp_manager.exp_dir must not be empty");

  auto& tr = t.trainer;
  tr.max_steps = positive("trainer.max_steps");
  tr.log_every_n_steps = positive("trainer.log_every_n_steps");
  tr.val_check_interval = non_negative("trainer.val_check_interval");
  tr.limit_val_batches = non_negative("trainer.limit_val_batches");
  tr.gradient_clip_val = c.get_double("trainer.gradient_clip_val");
  if (!(tr.gradient_clip_val >= 0))
    fail("trainer.gradient_clip_val must be >= 0, got ", tr.gradient_clip_val);
  tr.num_threads = non_negative("trainer.num_threads");
  tr.matmul_precision = c.get_string("trainer.matmul_precision");
  if (tr.num_threads == 0) {
    const char* env = std::getenv("NXD_NUM_THREADS");
    tr.num_threads = env && std::atoi(env) > 0 ? std::atoi(env)
                                               : std::max(1u, std::thread::hardware_concurrency());
    c.set("trainer.num_threads", tr.num_threads, "derived");  // config.yaml records the count
  }

  auto& d = t.data;
  d.kind = c.get_string("data.kind");
  d.path = c.get_string("data.path");
  d.token_dtype = c.get_string("data.token_dtype");
  d.seq_length = positive("data.seq_length");
  d.global_batch_size = positive("data.global_batch_size");
  d.val_fraction = c.get_double("data.val_fraction");
  d.shuffle = c.get_bool("data.shuffle");
  d.random_num_samples = positive("data.random_num_samples");
  if (!(d.val_fraction >= 0 && d.val_fraction < 1))
    fail("data.val_fraction must be in [0, 1), got ", d.val_fraction);
  if (d.kind != "random" && d.path.empty()) fail("data.path is empty (data.kind=", d.kind, ")");

  auto& m = t.model;
  m.arch = c.get_string("model.arch");
  m.vocab_size = positive("model.vocab_size");
  m.num_layers = positive("model.num_layers");
  m.hidden_size = positive("model.hidden_size");
  m.num_attention_heads = positive("model.num_attention_heads");
  if (c.is_null("model.num_kv_heads"))
    c.set("model.num_kv_heads", m.num_attention_heads, "derived");
  m.num_kv_heads = positive("model.num_kv_heads");
  if (m.hidden_size % m.num_attention_heads != 0)
    fail("model.num_attention_heads=", m.num_attention_heads,
         " does not divide model.hidden_size=", m.hidden_size);
  if (m.num_attention_heads % m.num_kv_heads != 0)
    fail("model.num_kv_heads=", m.num_kv_heads,
         " does not divide model.num_attention_heads=", m.num_attention_heads);
  if (m.arch == "gpt_neox" && m.num_kv_heads != m.num_attention_heads)
    fail("model.arch=gpt_neox has no grouped-query attention: model.num_kv_heads=", m.num_kv_heads,
         " must equal model.num_attention_heads=", m.num_attention_heads);
  if (c.is_null("model.ffn_hidden_size")) {
    int64_t f =
        m.arch == "gpt_neox" ? 4 * m.hidden_size : (8 * m.hidden_size / 3 + 255) / 256 * 256;
    c.set("model.ffn_hidden_size", f, "derived");
  }
  m.ffn_hidden_size = positive("model.ffn_hidden_size");
  if (c.is_null("model.max_position_embeddings"))
    c.set("model.max_position_embeddings", d.seq_length, "derived");
  m.max_position_embeddings = positive("model.max_position_embeddings");
  if (d.seq_length > m.max_position_embeddings)
    fail("data.seq_length=", d.seq_length,
         " exceeds model.max_position_embeddings=", m.max_position_embeddings);
  m.rotary_pct = c.get_double("model.rotary_pct");
  if (!(m.rotary_pct >= 0 && m.rotary_pct <= 1))
    fail("model.rotary_pct must be in [0, 1], got ", m.rotary_pct);
  m.rope_theta = c.get_double("model.rope_theta");
  m.norm_eps = c.get_double("model.norm_eps");
  m.init_std = c.get_double("model.init_std");
  m.dropout = c.get_double("model.dropout");
  m.tie_word_embeddings = c.get_bool("model.tie_word_embeddings");
  if (d.kind == "text" && m.vocab_size < 256)
    fail("model.vocab_size=", m.vocab_size,
         " is too small for byte-level text (data.kind=text "
         "needs >= 256)");

  auto& ds = t.dist;
  ds.tensor_model_parallel_size = positive("distributed_strategy.tensor_model_parallel_size");
  ds.sequence_parallel = c.get_bool("distributed_strategy.sequence_parallel");
  ds.backend = c.get_string("backend.kind");
  ds.instance = c.get_string("backend.instance");
  ds.timeline = c.get_string("backend.timeline");
  if (!ds.timeline.empty() && ds.backend != "sim")
    fail("backend.timeline=", ds.timeline, " needs backend.kind=sim (got ", ds.backend,
         "): only the sim backend has a modeled clock to trace");
  if (c.is_null("distributed_strategy.kv_replicator"))
    c.set("distributed_strategy.kv_replicator",
          std::max<int64_t>(1, ds.tensor_model_parallel_size / m.num_kv_heads), "derived");
  ds.kv_replicator = positive("distributed_strategy.kv_replicator");
  ds.grad_bucket_mb = c.get_double("distributed_strategy.grad_bucket_mb");
  if (!(ds.grad_bucket_mb > 0))
    fail("distributed_strategy.grad_bucket_mb must be positive, got ", ds.grad_bucket_mb);
  ds.world_size_from_launcher = c.is_null("backend.world_size") && ds.backend == "mpi";
  if (c.is_null("backend.world_size"))
    c.set("backend.world_size",
          ds.backend == "mpi" ? ds.tensor_model_parallel_size : int64_t{kDefaultSimWorld},
          "derived");
  ds.world_size = positive("backend.world_size");
  check_world(ds.world_size, ds.tensor_model_parallel_size);
  ds.data_parallel_size = ds.world_size / ds.tensor_model_parallel_size;
  if (c.is_null("data.micro_batch_size"))
    c.set("data.micro_batch_size",
          std::max<int64_t>(1, d.global_batch_size / ds.data_parallel_size), "derived");
  d.micro_batch_size = positive("data.micro_batch_size");
  const int64_t per_step = d.micro_batch_size * ds.data_parallel_size;
  if (d.global_batch_size % per_step != 0)
    fail("data.global_batch_size=", d.global_batch_size,
         " is not a multiple of data.micro_batch_size=", d.micro_batch_size,
         " x data-parallel size=", ds.data_parallel_size);
  t.grad_accum_steps = d.global_batch_size / per_step;
  if (ds.tensor_model_parallel_size > 1) {
    try {
      model_config(t).validate_parallel(static_cast<int>(ds.tensor_model_parallel_size));
    } catch (const UserError& e) {
      fail("distributed_strategy.tensor_model_parallel_size=", ds.tensor_model_parallel_size, ": ",
           e.what());
    }
  }

  auto& o = t.optim;
  o.name = c.get_string("model.optim.name");
  if (o.name == "adamw_fp32OptState") o.name = "adamw";
  o.lr = c.get_double("model.optim.lr");
  if (!(o.lr >= 0 && std::isfinite(o.lr))) fail("model.optim.lr must be >= 0, got ", o.lr);
  o.weight_decay = c.get_double("model.optim.weight_decay");
  if (!(o.weight_decay >= 0)) fail("model.optim.weight_decay must be >= 0, got ", o.weight_decay);
  const auto betas = c.get_doubles("model.optim.betas");
  o.beta1 = betas[0], o.beta2 = betas[1];
  for (double b : betas)
    if (!(b >= 0 && b < 1))
      fail("model.optim.betas must be in [0, 1), got [", betas[0], ", ", betas[1], "]");
  o.eps = c.get_double("model.optim.eps");
  if (!(o.eps >= 0)) fail("model.optim.eps must be >= 0, got ", o.eps);
  o.momentum = c.get_double("model.optim.momentum");
  o.nesterov = c.get_bool("model.optim.nesterov");
  if (o.nesterov && !(o.momentum > 0))
    fail("model.optim.nesterov needs model.optim.momentum > 0, got ", o.momentum);
  o.sched_name = c.get_string("model.optim.sched.name");
  if (o.sched_name == "LinearAnnealingWithWarmUp") o.sched_name = "linear";
  if (o.sched_name == "CosineAnnealing") o.sched_name = "cosine";
  if (c.is_null("model.optim.sched.max_steps"))
    c.set("model.optim.sched.max_steps", tr.max_steps, "derived");
  if (c.is_null("model.optim.sched.warmup_steps"))
    c.set("model.optim.sched.warmup_steps",
          std::min<int64_t>(50, c.get_int("model.optim.sched.max_steps") / 10), "derived");
  o.warmup_steps = non_negative("model.optim.sched.warmup_steps");
  o.decay_steps = positive("model.optim.sched.max_steps");
  if (o.sched_name != "constant" && o.warmup_steps > o.decay_steps)
    fail("model.optim.sched.warmup_steps=", o.warmup_steps,
         " exceeds model.optim.sched.max_steps=", o.decay_steps);
  o.min_lr = c.get_double("model.optim.sched.min_lr");
  if (!(o.min_lr >= 0 && o.min_lr <= o.lr))
    fail("model.optim.sched.min_lr=", o.min_lr, " must be in [0, model.optim.lr=", o.lr, "]");

  auto& g = t.generation;
  g.prompt = c.get_string("generation.prompt");
  g.max_new_tokens = non_negative("generation.max_new_tokens");
  g.temperature = c.get_double("generation.temperature");
  if (!(g.temperature >= 0)) fail("generation.temperature must be >= 0, got ", g.temperature);
  g.top_k = non_negative("generation.top_k");
  if (g.max_new_tokens > 0 && g.prompt.empty() && d.kind == "text")
    fail("generation.prompt is empty (set generation.max_new_tokens=0 for no sample)");

  t.resolved = c;
  return t;
}

}  // namespace nxd::trainer

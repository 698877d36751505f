// Qwen2/Qwen2.5, Qwen3 and Mistral configs (transformers' Qwen2Config, Qwen3Config,
// MistralConfig). Their modeling code is Llama's with:
//   Qwen2:   biases on q/k/v_proj (always), none on o_proj or the MLP;
//   Qwen3:   q_norm/k_norm (RMSNorm over head_dim, eps rms_norm_eps) on every query and key head
//            before rotary, head_dim its own key, attention_bias on q/k/v/o_proj;
//   Mistral: sliding_window (each token sees its last sliding_window positions), head_dim.
// Qwen's sliding window applies to the layers from max_window_layers on when use_sliding_window
// (transformers' layer_types); nxd's window is the same on every layer, so a config windowing
// only some layers is refused by name.
#include "nxd/checkpoint/hf_families.h"

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/io/bounded_read.h"

namespace nxd::ckpt::detail {
using json = nlohmann::json;

namespace {

constexpr int64_t kMaxLen = int64_t{1} << 24;

bool set(const json& j, const std::string& key) {
  return j.contains(key) && !j[key].is_null();
}

// Dropout inside attention (on the probabilities) is not in nxd's model: refused when nonzero.
void refuse_attention_dropout(const json& j) {
  if (set(j, "attention_dropout") && j["attention_dropout"].get<double>() != 0.0)
    refuse(str("attention_dropout ", j["attention_dropout"].get<double>(),
               " (nxd has no dropout on attention probabilities)"));
}

// Qwen's use_sliding_window / max_window_layers / layer_types: one window for every layer or none.
void read_qwen_window(const json& j, ModelConfig& c) {
  const int64_t n = c.num_layers;
  std::vector<bool> windowed(static_cast<size_t>(n), false);
  if (set(j, "layer_types")) {
    const json& t = j["layer_types"];
    if (!t.is_array() || static_cast<int64_t>(t.size()) != n)
      refuse(str("layer_types of ", t.is_array() ? t.size() : 0, " entries for ", n, " layers"));
    for (int64_t l = 0; l < n; ++l) {
      const std::string s = t[static_cast<size_t>(l)].get<std::string>();
      if (s != "full_attention" && s != "sliding_attention")
        refuse(str("layer_types[", l, "] '", io::shorten(s), "'"));
      windowed[static_cast<size_t>(l)] = s == "sliding_attention";
    }
  } else if (j.value("use_sliding_window", false) && set(j, "sliding_window")) {
    const int64_t first =
        set(j, "max_window_layers")
            ? io::json_int(j, "max_window_layers", 0, kMaxLen, "config.json", "import-hf")
            : 0;
    for (int64_t l = first; l < n; ++l) windowed[static_cast<size_t>(l)] = true;
  }
  const int64_t count = std::count(windowed.begin(), windowed.end(), true);
  if (count == 0) return;
  if (count != n)
    refuse(str("a sliding window on ", count, " of ", n,
               " layers (use_sliding_window with max_window_layers / layer_types; nxd's window is "
               "the same on every layer)"));
  if (!set(j, "sliding_window")) refuse("sliding_attention layers without a sliding_window");
  c.sliding_window = read_sliding_window(j, c);
}

// The llama keys `j` was given that a family's config does not have.
void erase_llama_only(json& j) {
  j.erase("attention_bias");
  j.erase("mlp_bias");
}

void refuse_export(const ModelConfig& c, bool bad, const std::string& family,
                   const std::string& form) {
  if (bad)
    throw CheckpointError(str("[export-hf] ", family, " with attention_bias=", c.attention_bias,
                              " qkv_bias=", c.qkv_bias, " mlp_bias=", c.mlp_bias,
                              " qk_norm=", c.qk_norm, " head_dim=", c.head_dim(),
                              " has no transformers form (", form, ")"));
}

}  // namespace

int64_t read_sliding_window(const json& j, const ModelConfig& c) {
  if (!set(j, "sliding_window")) return 0;
  const int64_t w = io::json_int(j, "sliding_window", 1, kMaxLen, "config.json", "import-hf");
  return w >= c.max_position_embeddings ? 0 : w;  // a window past every position is no window
}

void read_qwen2(const json& j, ModelConfig& c) {
  read_llama(j, c);
  c.arch = "qwen2";
  c.attention_bias = false;  // Qwen2Attention: bias=True on q/k/v_proj, False on o_proj
  c.mlp_bias = false;
  c.qkv_bias = true;
  c.attention_head_dim = 0;  // Qwen2 has no head_dim key: hidden_size / heads
  refuse_attention_dropout(j);
  read_qwen_window(j, c);
}

void read_qwen3(const json& j, ModelConfig& c) {
  read_llama(j, c);  // head_dim, attention_bias (q/k/v/o_proj)
  c.arch = "qwen3";
  if (!set(j, "head_dim") && c.hidden_size / c.num_attention_heads != 128)
    c.attention_head_dim = 128;  // Qwen3Config's default head_dim
  c.mlp_bias = false;
  c.qk_norm = true;
  refuse_attention_dropout(j);
  read_qwen_window(j, c);
}

void read_mistral(const json& j, ModelConfig& c) {
  read_llama(j, c);
  c.arch = "mistral";
  c.attention_bias = c.mlp_bias = false;  // MistralAttention and MistralMLP: no biases
  refuse_attention_dropout(j);
  // MistralConfig's default sliding_window is 4096 when the key is absent
  c.sliding_window = j.contains("sliding_window")       ? read_sliding_window(j, c)
                     : 4096 < c.max_position_embeddings ? 4096
                                                        : 0;
}

void write_qwen2(const ModelConfig& c, json& j) {
  refuse_export(c,
                c.attention_bias || c.mlp_bias || !c.qkv_bias || c.qk_norm ||
                    c.head_dim() * c.num_attention_heads != c.hidden_size,
                "qwen2", "Qwen2: biases on q/k/v_proj only, no qk_norm, head_dim = hidden / heads");
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["model_type"] = "qwen2";
  erase_llama_only(j);
  j.erase("head_dim");
  j["use_sliding_window"] = c.sliding_window > 0;
  j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  j["max_window_layers"] = c.sliding_window > 0 ? 0 : c.num_layers;
  j["attention_dropout"] = 0.0;
}

void write_qwen3(const ModelConfig& c, json& j) {
  refuse_export(c, c.mlp_bias || (c.qkv_bias && !c.attention_bias) || !c.qk_norm, "qwen3",
                "Qwen3: qk_norm, attention_bias on q/k/v/o_proj alike, no MLP biases");
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = "qwen3";
  j.erase("mlp_bias");
  j["attention_bias"] = c.attention_bias;
  j["use_sliding_window"] = c.sliding_window > 0;
  j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  j["max_window_layers"] = c.sliding_window > 0 ? 0 : c.num_layers;
  j["attention_dropout"] = 0.0;
}

void write_mistral(const ModelConfig& c, json& j) {
  refuse_export(c, c.attention_bias || c.mlp_bias || c.qkv_bias || c.qk_norm, "mistral",
                "Mistral: no biases, no qk_norm");
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  erase_llama_only(j);
  j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  j["attention_dropout"] = 0.0;
}

}  // namespace nxd::ckpt::detail

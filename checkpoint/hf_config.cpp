// transformers' config.json <-> ModelConfig (LlamaForCausalLM, MixtralForCausalLM,
// GPTNeoXForCausalLM; Qwen2, Qwen3 and Mistral in hf_families.cpp). Every key
// that changes the model's math is either mapped or refused by name; keys that do not (token ids,
// use_cache, architectures, transformers_version, ...) are ignored, as transformers' modeling
// code ignores them.
#include <cmath>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/hf_families.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/io/bounded_read.h"
#include "nxd/io/hf_folder.h"

namespace nxd::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// An integer field of config.json in [lo, hi] (ConfigError naming the key and value otherwise):
// checked before it sizes or divides anything.
int64_t hf_int(const json& j, const std::string& key, int64_t lo, int64_t hi) {
  return io::json_int(j, key, lo, hi, "config.json", "import-hf");
}
constexpr int64_t kMaxDim = int64_t{1} << 20;  // widths, heads, head_dim, experts
constexpr int64_t kMaxLen = int64_t{1} << 24;  // vocabulary, positions, layers

}  // namespace

namespace detail {
[[noreturn]] void refuse(const std::string& what) {
  throw CheckpointError(str("[import-hf] config.json: ", what, " is not supported by nxd's model"));
}

void read_llama(const json& j, ModelConfig& c) {
  c.arch = "llama";
  c.num_kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                       ? hf_int(j, "num_key_value_heads", 1, c.num_attention_heads)
                       : c.num_attention_heads;
  c.norm_eps = j.at("rms_norm_eps").get<double>();
  c.rope_theta = j.value("rope_theta", 10000.0);
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act == "silu" || act == "gelu" || act == "gelu_new")
    c.hidden_act = act;
  else if (act == "gelu_pytorch_tanh")
    c.hidden_act = "gelu_new";  // the same tanh approximation
  else
    refuse(str("llama hidden_act '", act, "' (silu, gelu, gelu_new, gelu_pytorch_tanh are)"));
  c.attention_bias = j.value("attention_bias", false);
  c.mlp_bias = j.value("mlp_bias", false);
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    const int64_t hd = hf_int(j, "head_dim", 1, kMaxDim);
    if (hd != c.hidden_size / c.num_attention_heads || c.hidden_size % c.num_attention_heads != 0)
      c.attention_head_dim = hd;
  }
}
}  // namespace detail

namespace {
using detail::refuse;

void read_gpt_neox(const json& j, ModelConfig& c) {
  c.arch = "gpt_neox";
  // newer transformers call rotary_pct partial_rotary_factor and rotary_emb_base rope_theta
  c.rotary_pct = j.contains("rotary_pct") ? j["rotary_pct"].get<double>()
                                          : j.at("partial_rotary_factor").get<double>();
  c.rope_theta = j.contains("rotary_emb_base") ? j["rotary_emb_base"].get<double>()
                                               : j.value("rope_theta", 10000.0);
  c.norm_eps = j.at("layer_norm_eps").get<double>();
  c.use_parallel_residual = j.value("use_parallel_residual", true);
  const std::string act = j.value("hidden_act", std::string("gelu"));
  if (act == "gelu")
    c.gelu_tanh = false;
  else if (act == "gelu_new" || act == "gelu_pytorch_tanh")
    c.gelu_tanh = true;  // the same tanh approximation
  else
    refuse(str("gpt_neox hidden_act '", act, "' (gelu, gelu_new, gelu_pytorch_tanh are)"));
  // GPTNeoXConfig's attention_bias defaults to true; nxd's GPT-NeoX always has the biases
  if (!j.value("attention_bias", true)) refuse("gpt_neox attention_bias: false");
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null() &&
      hf_int(j, "num_key_value_heads", 1, kMaxDim) != c.num_attention_heads)
    refuse(str("gpt_neox num_key_value_heads ", j["num_key_value_heads"].get<int64_t>(),
               " != num_attention_heads ", c.num_attention_heads));
}

// transformers' MixtralConfig: the llama keys it shares, and the experts. transformers computes one
// load-balancing loss over every layer's router logits concatenated, E * sum_e f_e P_e (top_k
// when balanced); nxd adds one E/k * sum_e f_e P_e per MoE layer (1 each when balanced,
// layers/moe/config.h). The coefficients are converted so that a balanced router costs the same:
// nxd's = transformers' * top_k / num_layers (the functions differ away from balance).
void write_mixtral(const ModelConfig& c, json& j) {
  if (c.moe.frequency != 1 || !c.moe.dropless || !c.moe.normalize_top_k_affinities ||
      c.attention_bias || c.mlp_bias || c.qkv_bias || c.qk_norm || c.moe.router_z_loss_coef > 0)
    refuse(str("mixtral with moe.frequency=", c.moe.frequency, " dropless=", c.moe.dropless,
               " normalize_top_k_affinities=", c.moe.normalize_top_k_affinities,
               " router_z_loss_coef=", c.moe.router_z_loss_coef,
               " attention_bias=", c.attention_bias, " mlp_bias=", c.mlp_bias,
               " (transformers' Mixtral: every layer MoE, dropless, normalized, no z-loss, no "
               "biases)"));
  j["architectures"] = {"MixtralForCausalLM"};
  j["model_type"] = "mixtral";
  j.erase("attention_bias");
  j.erase("mlp_bias");
  j["num_local_experts"] = c.moe.num_experts;
  j["num_experts_per_tok"] = c.moe.top_k;
  j["router_aux_loss_coef"] = c.moe.router_aux_loss_coef * static_cast<double>(c.num_layers) /
                              static_cast<double>(c.moe.top_k);
  j["output_router_logits"] = false;
  j["router_jitter_noise"] = 0.0;
  j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
}

void read_mixtral(const json& j, ModelConfig& c) {
  detail::read_llama(j, c);
  c.arch = "mixtral";
  c.sliding_window = detail::read_sliding_window(j, c);
  if (j.value("router_jitter_noise", 0.0) != 0.0) refuse("mixtral router_jitter_noise != 0");
  c.moe.num_experts = hf_int(j, "num_local_experts", 1, kMaxDim);
  c.moe.top_k = hf_int(j, "num_experts_per_tok", 1, c.moe.num_experts);
  c.moe.frequency = 1;
  c.moe.dropless = true;
  c.moe.normalize_top_k_affinities = true;
  c.moe.router_aux_loss_coef = j.value("router_aux_loss_coef", 0.001) *
                               static_cast<double>(c.moe.top_k) / static_cast<double>(c.num_layers);
}

}  // namespace

json hf_config_json(const ModelConfig& c) {
  json j = {{"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.ffn_size()},
            {"num_hidden_layers", c.num_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"max_position_embeddings", c.max_position_embeddings},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"initializer_range", c.init_std},
            {"rope_scaling", io::rope_scaling_json(c.rope_scaling)},
            {"torch_dtype", c.dtype == DType::bf16  ? "bfloat16"
                            : c.dtype == DType::f64 ? "float64"
                                                    : "float32"}};
  if (is_llama_family(c.arch)) {
    if ((c.arch == "llama" || c.arch == "mixtral") &&
        (c.qkv_bias || c.qk_norm || (c.arch == "llama" && c.sliding_window > 0)))
      throw CheckpointError(str("[export-hf] ", c.arch, " with qkv_bias=", c.qkv_bias,
                                " qk_norm=", c.qk_norm, " sliding_window=", c.sliding_window,
                                " has no transformers form (qwen2, qwen3 and mistral do)"));
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["num_key_value_heads"] = c.kv_heads();
    j["rms_norm_eps"] = c.norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["hidden_act"] = c.hidden_act;
    j["head_dim"] = c.head_dim();
    j["attention_bias"] = c.attention_bias;
    j["mlp_bias"] = c.mlp_bias;
    if (c.arch == "mixtral") write_mixtral(c, j);
    if (c.arch == "qwen2") detail::write_qwen2(c, j);
    if (c.arch == "qwen3") detail::write_qwen3(c, j);
    if (c.arch == "mistral") detail::write_mistral(c, j);
  } else if (c.arch == "gpt_neox") {
    if (c.attention_head_dim > 0 && c.attention_head_dim * c.num_attention_heads != c.hidden_size)
      throw CheckpointError(
          str("[export-hf] gpt_neox in transformers has head_dim = hidden_size / "
              "num_attention_heads; this model's is ",
              c.attention_head_dim));
    j["architectures"] = {"GPTNeoXForCausalLM"};
    j["model_type"] = "gpt_neox";
    j["rotary_pct"] = c.rotary_pct;
    j["rotary_emb_base"] = c.rope_theta;
    j["layer_norm_eps"] = c.norm_eps;
    j["use_parallel_residual"] = c.use_parallel_residual;
    j["hidden_act"] = c.gelu_tanh ? "gelu_new" : "gelu";
    j["attention_bias"] = true;
  } else {
    throw CheckpointError(str("[export-hf] no transformers form for arch '", c.arch, "'"));
  }
  return j;
}

ModelConfig model_config_from_hf(const json& j) {
  try {
    ModelConfig c;
    if (!j.is_object()) throw CheckpointError("[import-hf] config.json is not a JSON object");
    const std::string type = j.at("model_type").get<std::string>();
    c.vocab_size = hf_int(j, "vocab_size", 1, kMaxLen);
    c.hidden_size = hf_int(j, "hidden_size", 1, kMaxDim);
    c.ffn_hidden_size = hf_int(j, "intermediate_size", 1, kMaxDim);
    c.num_layers = hf_int(j, "num_hidden_layers", 1, kMaxLen);
    c.num_attention_heads = hf_int(j, "num_attention_heads", 1, kMaxDim);
    c.max_position_embeddings = hf_int(j, "max_position_embeddings", 1, kMaxLen);
    // transformers' default for both architectures' configs: Llama ties only when asked, and
    // GPTNeoXConfig's default is False too
    c.tie_word_embeddings = j.value("tie_word_embeddings", false);
    c.init_std = j.value("initializer_range", 0.02);
    c.init_method = InitMethod::normal;
    c.dtype = DType::f32;  // weights are cast to f32 as transformers does (hf.h)
    c.rope_scaling = io::read_rope_scaling(j);
    if (type == "llama")
      detail::read_llama(j, c);
    else if (type == "qwen2")
      detail::read_qwen2(j, c);
    else if (type == "qwen3")
      detail::read_qwen3(j, c);
    else if (type == "mistral")
      detail::read_mistral(j, c);
    else if (type == "gpt_neox")
      read_gpt_neox(j, c);
    else if (type == "mixtral")
      read_mixtral(j, c);
    else
      throw CheckpointError(str("model_type '", io::shorten(type),
                                "' is not llama, mixtral, qwen2, qwen3, mistral or gpt_neox"));
    c.validate();
    return c;
  } catch (const UserError& e) {
    const std::string m = e.what();
    if (m.rfind("[import-hf]", 0) == 0) throw CheckpointError(m);
    throw CheckpointError(str("[import-hf] config.json: ", m));
  } catch (const std::exception& e) {
    throw CheckpointError(str("[import-hf] config.json: ", e.what()));
  }
}

ModelConfig read_hf_config(const fs::path& hf_dir) {
  const fs::path f = hf_dir / "config.json";
  const json j = io::read_hf_config_json(hf_dir);
  try {
    ModelConfig mc = model_config_from_hf(j);
    mc.name_or_path = hf_dir.string();
    return mc;
  } catch (const UserError& e) {
    std::string m = e.what();
    const std::string p = "[import-hf] config.json";
    if (m.rfind(p, 0) == 0) m = "[import-hf] " + f.string() + m.substr(p.size());
    throw CheckpointError(m);
  }
}

}  // namespace nxd::ckpt

#include "nxd/layers/models/config.h"

#include "nxd/collectives/parallel_state.h"
#include "nxd/runtime/error.h"

namespace nxd {

bool is_llama_family(const std::string& arch) {
  return arch == "llama" || arch == "mixtral" || arch == "qwen2" || arch == "qwen3" ||
         arch == "mistral";
}

int64_t ModelConfig::ffn_size() const {
  if (ffn_hidden_size > 0) return ffn_hidden_size;
  if (arch == "gpt_neox") return 4 * hidden_size;
  // Llama and Mixtral: 2/3 of 4*hidden rounded up to a multiple of 256 (Meta's multiple_of).
  int64_t f = (8 * hidden_size) / 3;
  return (f + 255) / 256 * 256;
}

int64_t ModelConfig::rotary_dim() const {
  if (arch == "gpt_neox") return static_cast<int64_t>(static_cast<double>(head_dim()) * rotary_pct);
  return head_dim();
}

namespace {
double mlp_weights(const ModelConfig& c) {
  return (c.arch == "gpt_neox" ? 2.0 : 3.0) * static_cast<double>(c.hidden_size) *
         static_cast<double>(c.ffn_size());
}
double moe_layers(const ModelConfig& c) {
  if (!c.moe.enabled() || c.moe.frequency <= 0 || c.num_layers <= 0) return 0;
  return static_cast<double>((c.num_layers - 1) / c.moe.frequency + 1);  // l % frequency == 0
}
}  // namespace

double ModelConfig::min_expert_parameter_count() const {
  return moe_layers(*this) * static_cast<double>(moe.num_experts) * mlp_weights(*this);
}

double ModelConfig::min_parameter_count() const {
  const double h = static_cast<double>(hidden_size), v = static_cast<double>(vocab_size);
  const double q = static_cast<double>(num_attention_heads) * static_cast<double>(head_dim());
  const double kv = static_cast<double>(kv_heads()) * static_cast<double>(head_dim());
  const double attention = h * (2 * q + 2 * kv);  // q, o and k, v
  const double layers = static_cast<double>(num_layers);
  return v * h * (tie_word_embeddings ? 1 : 2) + layers * attention +
         (layers - moe_layers(*this)) * mlp_weights(*this) + min_expert_parameter_count();
}

const char* checkpoint_granularity_name(CheckpointGranularity g) {
  switch (g) {
    case CheckpointGranularity::none:
      return "null";
    case CheckpointGranularity::full:
      return "full";
    case CheckpointGranularity::selective:
      return "selective";
  }
  return "?";
}

CheckpointGranularity parse_checkpoint_granularity(const std::string& s) {
  if (s == "null" || s == "none") return CheckpointGranularity::none;
  if (s == "full") return CheckpointGranularity::full;
  if (s == "selective") return CheckpointGranularity::selective;
  throw ConfigError(str("[ModelConfig] activations_checkpoint_granularity '", s,
                        "' is not one of null, full, selective"));
}

int model_tensor_parallel_size() {
  return parallel_state::model_parallel_is_initialized()
             ? parallel_state::get_tensor_model_parallel_size()
             : 1;
}

void ModelConfig::validate() const {
  auto fail = [](auto&&... a) { throw ConfigError(str("[ModelConfig] ", a...)); };
  if (arch.empty()) fail("arch must name the model family (llama, gpt_neox, or a user's own)");
  if (vocab_size <= 0) fail("vocab_size must be positive, got ", vocab_size);
  if (num_layers <= 0) fail("num_layers must be positive, got ", num_layers);
  if (hidden_size <= 0) fail("hidden_size must be positive, got ", hidden_size);
  if (num_attention_heads <= 0)
    fail("num_attention_heads must be positive, got ", num_attention_heads);
  if (num_kv_heads < 0) fail("num_kv_heads must be positive (or 0 = heads), got ", num_kv_heads);
  if (ffn_hidden_size < 0)
    fail("ffn_hidden_size must be positive (or 0 = default), got ", ffn_hidden_size);
  if (max_position_embeddings <= 0)
    fail("max_position_embeddings must be positive, got ", max_position_embeddings);
  if (attention_head_dim < 0)
    fail("attention_head_dim must be positive (or 0 = hidden_size / heads), got ",
         attention_head_dim);
  if (attention_head_dim == 0 && hidden_size % num_attention_heads != 0)
    fail("num_attention_heads=", num_attention_heads, " does not divide hidden_size=", hidden_size);
  if (num_attention_heads % kv_heads() != 0)
    fail("num_kv_heads=", kv_heads(), " does not divide num_attention_heads=", num_attention_heads);
  if (arch == "gpt_neox" && kv_heads() != num_attention_heads)
    fail("gpt_neox has no grouped-query attention: num_kv_heads=", kv_heads(),
         " must equal num_attention_heads=", num_attention_heads);
  if (arch == "gpt_neox" && !(rotary_pct >= 0.0 && rotary_pct <= 1.0))
    fail("rotary_pct must be in [0, 1], got ", rotary_pct);
  if (rotary_dim() % 2 != 0)
    fail("rotary dims per head must be even: head_dim=", head_dim(), " rotary_pct=", rotary_pct,
         " give ", rotary_dim());
  if (!(rope_theta > 0.0)) fail("rope_theta must be positive, got ", rope_theta);
  if (rope_scaling.kind != RopeScaling::Kind::none &&
      !(rope_scaling.factor > 0 && rope_scaling.low_freq_factor > 0 &&
        rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
        rope_scaling.original_max_position_embeddings > 0))
    fail("rope_scaling ", rope_scaling_name(rope_scaling.kind),
         " needs factor > 0, 0 < "
         "low_freq_factor < high_freq_factor and original_max_position_embeddings > 0, got factor=",
         rope_scaling.factor, " low_freq_factor=", rope_scaling.low_freq_factor,
         " high_freq_factor=", rope_scaling.high_freq_factor,
         " original_max_position_embeddings=", rope_scaling.original_max_position_embeddings);
  if (!(norm_eps > 0.0)) fail("norm_eps must be positive, got ", norm_eps);
  if (is_llama_family(arch) && hidden_act != "silu" && hidden_act != "gelu" &&
      hidden_act != "gelu_new")
    fail("llama hidden_act must be silu, gelu or gelu_new, got '", hidden_act, "'");
  if (sliding_window < 0) fail("sliding_window must be >= 0 (0 = none), got ", sliding_window);
  if (!is_llama_family(arch) && (qkv_bias || qk_norm || sliding_window > 0))
    fail("qkv_bias, qk_norm and sliding_window are llama-family fields, not ", arch, "'s");
  if (!(init_std >= 0.0)) fail("init_std must be >= 0, got ", init_std);
  if (!(dropout >= 0.0 && dropout < 1.0)) fail("dropout must be in [0, 1), got ", dropout);
  if (!is_floating(dtype)) fail("dtype must be floating, got ", dtype_name(dtype));
  if (kv_size_multiplier < 1) fail("kv_size_multiplier must be >= 1, got ", kv_size_multiplier);
  moe.validate();
  if (arch == "mixtral" && !moe.enabled()) fail("mixtral needs moe.num_experts > 0");
  if (moe.enabled() && arch != "llama" && arch != "mixtral")
    fail("moe (num_experts=", moe.num_experts, ") is built for llama and mixtral, not ", arch);
  if (moe.enabled() && hidden_act != "silu")
    fail("moe experts are SwiGLU: hidden_act must be silu, got '", hidden_act, "'");
}

void ModelPart::validate(const ModelConfig& c) const {
  if (layer_begin < 0 || layer_begin > end(c) || end(c) > c.num_layers)
    throw ConfigError(nxd::str("[ModelPart] layers [", layer_begin, ", ", end(c),
                               ") are not a range of the model's ", c.num_layers, " layers"));
}

std::string ModelPart::str(const ModelConfig& c) const {
  std::string s = embedding ? "embedding + " : "";
  s += nxd::str("layers [", layer_begin, ", ", end(c), ")");
  if (head) s += " + head";
  return s;
}

void ModelConfig::validate_parallel(int tp) const {
  auto fail = [](auto&&... a) { throw ConfigError(str("[ModelConfig] ", a...)); };
  if (tp < 1) fail("tensor parallel size must be >= 1, got ", tp);
  if (tp == 1) return;
  const int64_t h = num_attention_heads, kv = kv_heads(), m = kv_size_multiplier;
  if (h % tp != 0)
    fail("num_attention_heads=", h, " is not divisible by tensor parallel size ", tp);
  if (tp % m != 0) fail("tensor parallel size ", tp, " is not divisible by kv_size_multiplier=", m);
  if ((kv * m) % tp != 0)
    fail("num_kv_heads=", kv, " x kv_size_multiplier=", m,
         " is not divisible by tensor parallel size ", tp, " (set kv_size_multiplier=", tp / kv,
         ")");
  const int64_t need = kv >= tp ? 1 : tp / kv;
  if (m != need)
    fail("kv_size_multiplier=", m, " with num_kv_heads=", kv, " at tensor parallel size ", tp,
         " would give ranks KV heads their query heads do not read: it must be max(1, tp / "
         "num_kv_heads) = ",
         need);
  if (ffn_size() % tp != 0)
    fail("ffn_hidden_size=", ffn_size(), " is not divisible by tensor parallel size ", tp);
  if (vocab_size % tp != 0)
    fail("vocab_size=", vocab_size, " is not divisible by tensor parallel size ", tp,
         " (pad the vocabulary)");
}

ModelConfig ModelConfig::llama2_7b() {
  ModelConfig c;
  c.vocab_size = 32000;
  c.num_layers = 32;
  c.hidden_size = 4096;
  c.num_attention_heads = 32;
  c.ffn_hidden_size = 11008;
  c.max_position_embeddings = 4096;
  return c;
}

}  // namespace nxd

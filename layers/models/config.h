#pragma once
// ModelConfig: every size of a decoder-only language model. One struct serves both families;
// fields that one family ignores say so.
//
// Parallelism: the tensor-parallel degree is not a model field. A model is built over the
// parallel_state TP group current at construction (TP = 1 when parallel_state is not
// initialized); with one TP rank it is exactly the plain model (same parameters, same numbers) and
// sequence_parallel and kv_size_multiplier have no effect.
#include <cstdint>
#include <string>

#include "nxd/layers/init_scheme.h"
#include "nxd/layers/moe/config.h"
#include "nxd/runtime/allocator.h"
#include "nxd/runtime/dtype.h"
#include "nxd/runtime/rope_scaling.h"

namespace nxd {

// Activation recomputation (NxDT calls it activation checkpointing: its key
// model.activations_checkpoint_granularity and this enum keep NxDT's name): none keeps every
// activation for backward; full recomputes each decoder layer from its input in backward;
// selective recomputes only the attention core (scores, softmax, PV), whose [B,H,S,S]
// probabilities dominate activation memory at long sequences. Gradients are bitwise those of
// none (autograd::recompute replays the RNG).
enum class CheckpointGranularity { none, full, selective };
const char* checkpoint_granularity_name(CheckpointGranularity g);  // "null", "full", "selective"
// "null" (or "none"), "full", "selective"; ConfigError naming the string otherwise.
CheckpointGranularity parse_checkpoint_granularity(const std::string& s);

struct ModelConfig {
  // "llama" | "gpt_neox" | "mixtral" (llama with MoE MLPs) | "qwen2" | "qwen3" | "mistral": the
  // last three are llama with the fields below (is_llama_family; docs/design/families.md)
  std::string arch = "llama";
  // Where the architecture was read from (transformers' config._name_or_path): the transformers
  // folder or config.json file; empty for a config built in code. Not part of the architecture.
  std::string name_or_path;
  int64_t vocab_size = 256;
  int64_t num_layers = 4;
  int64_t hidden_size = 256;
  int64_t num_attention_heads = 4;
  int64_t num_kv_heads = 0;  // 0 = num_attention_heads (GPT-NeoX: must equal it)
  // Size of one attention head; 0 = hidden_size / num_attention_heads. Set when the heads do not
  // tile hidden_size, as in a model whose heads were padded for tensor parallelism (pad.h).
  int64_t attention_head_dim = 0;
  int64_t ffn_hidden_size = 0;  // 0 = default: llama 256-aligned 8/3*hidden, gpt_neox 4*hidden
  int64_t max_position_embeddings = 2048;
  double rotary_pct = 0.25;  // gpt_neox: rotary on int(head_dim * rotary_pct) features; llama: all
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // transformers' rope_scaling: linear or llama3 (rope_scaling.h)
  double norm_eps = 1e-5;    // RMSNorm (llama) / LayerNorm (gpt_neox) epsilon
  // Initialization (layers/init_scheme.h): normal = Hugging Face's normal(0, init_std) weights and
  // zero biases; nxd = PyTorch's/NxD's layer defaults; scaled_normal = normal with the residual
  // outputs at init_std / sqrt(2 num_layers).
  InitMethod init_method = InitMethod::normal;
  double init_std = 0.02;             // normal, scaled_normal
  bool tie_word_embeddings = false;   // the output head reuses the input embedding
  double dropout = 0.0;               // on the attention and MLP outputs (training only)
  bool gelu_tanh = false;             // gpt_neox: tanh GELU ("gelu_new") instead of erf ("gelu")
  bool use_parallel_residual = true;  // gpt_neox: x + attn(ln1(x)) + mlp(ln2(x))
  // llama (transformers' LlamaConfig): the MLP gate's activation (silu, gelu, gelu_new), and
  // biases on q/k/v/o_proj (attention_bias) and gate/up/down_proj (mlp_bias)
  std::string hidden_act = "silu";
  bool attention_bias = false;
  bool mlp_bias = false;
  // llama family: biases on q/k/v_proj only (Qwen2's), an RMSNorm over head_dim on every query and
  // key head before rotary (Qwen3's q_norm/k_norm, eps norm_eps), and sliding-window attention:
  // > 0 lets each token see its last sliding_window positions, itself included (transformers'
  // sliding_window: Mistral's, Qwen's use_sliding_window), 0 = full causal.
  bool qkv_bias = false;
  bool qk_norm = false;
  int64_t sliding_window = 0;
  DType dtype = DType::f32;      // parameter dtype
  Device device = Device::host;  // meta: shapes only
  // TP > 1: hidden states are split along the sequence between the tensor-parallel regions
  // (NxD's sequence_parallel; docs/NXD_INTERNALS.md).
  bool sequence_parallel = false;
  // TP > 1: K/V heads replicated this many times over the TP ranks (NxD's kv_replicator) so that
  // TP may exceed num_kv_heads. Each rank's query heads must find their KV heads locally, so it
  // must be max(1, TP / num_kv_heads) (checked by validate_parallel).
  int64_t kv_size_multiplier = 1;
  CheckpointGranularity activations_checkpoint_granularity = CheckpointGranularity::none;
  // Mixture of experts (layers/moe/): llama's MLP becomes a MoeMlp (registered as Mixtral's
  // block_sparse_moe) every moe.frequency layers; mixtral needs it. num_experts == 0: dense.
  MoeConfig moe;

  // Throws ConfigError naming the offending values (unknown arch, non-positive sizes, heads not
  // dividing hidden_size, kv heads not dividing heads, odd rotary dims, eps/std/dropout ranges).
  void validate() const;
  // Throws ConfigError naming the values unless the model can be split over `tp` ranks: query
  // heads, kv heads x kv_size_multiplier, ffn size and vocabulary divisible by tp, and
  // kv_size_multiplier == max(1, tp / kv heads). Nothing to check when tp == 1.
  void validate_parallel(int tp) const;

  // Llama-2-7B's sizes (its Hugging Face config: vocab 32000, 32 layers, hidden 4096, 32 heads,
  // no GQA, ffn 11008, 4096 positions, RMSNorm eps 1e-5); every other field at its default.
  static ModelConfig llama2_7b();

  InitScheme init_scheme() const { return {init_method, init_std, num_layers}; }
  int64_t head_dim() const {
    return attention_head_dim > 0 ? attention_head_dim : hidden_size / num_attention_heads;
  }
  int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_attention_heads; }
  int64_t ffn_size() const;
  int64_t rotary_dim() const;  // features rotated per head
  // A lower bound on the parameters, in closed form (nothing is built): the embedding, an untied
  // output head, each layer's attention projections and MLP weights (every expert's); norms,
  // biases and routers are left out. Tools refuse a model that cannot fit with it before anything
  // is allocated (docs/design/input_limits.md). A double: hostile sizes overflow int64_t.
  double min_parameter_count() const;
  // Of it, the weights of the experts (0 for a dense model): expert parallelism splits them.
  double min_expert_parameter_count() const;
};

// A pipeline stage's share of a model: the decoder layers [layer_begin, layer_end), plus the input
// embedding (the first stage) and/or the final norm, output head and loss (the last stage).
// Parameters keep the whole model's names (layer i stays "model.layers.i"), so init by name gives
// them the whole model's values. A last stage of a model with tie_word_embeddings also holds the
// input embedding (its head's weight; the pipeline keeps the two copies equal). The default is
// the whole model.
struct ModelPart {
  int64_t layer_begin = 0;
  int64_t layer_end = -1;  // -1: num_layers
  bool embedding = true;
  bool head = true;
  int64_t end(const ModelConfig& c) const { return layer_end < 0 ? c.num_layers : layer_end; }
  bool whole(const ModelConfig& c) const {
    return embedding && head && layer_begin == 0 && end(c) == c.num_layers;
  }
  // Throws ConfigError naming the values unless 0 <= layer_begin <= end <= num_layers.
  void validate(const ModelConfig& c) const;
  std::string str(const ModelConfig& c) const;  // "layers [2, 4) + head"
};

// The architectures built by LlamaForCausalLM: llama, mixtral, qwen2, qwen3, mistral.
bool is_llama_family(const std::string& arch);

// The tensor-parallel size models are built for: the parallel_state TP size, or 1 when
// parallel_state is not initialized.
int model_tensor_parallel_size();

}  // namespace nxd

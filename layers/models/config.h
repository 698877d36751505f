#pragma once
// ModelConfig: every size of a decoder-only language model. One struct serves both families;
// fields that one family ignores say so.
#include <cstdint>
#include <string>

#include "nxd/runtime/allocator.h"
#include "nxd/runtime/dtype.h"

namespace nxd {

struct ModelConfig {
  std::string arch = "llama";  // "llama" | "gpt_neox"
  int64_t vocab_size = 256;
  int64_t num_layers = 4;
  int64_t hidden_size = 256;
  int64_t num_attention_heads = 4;
  int64_t num_kv_heads = 0;     // 0 = num_attention_heads (GPT-NeoX: must equal it)
  int64_t ffn_hidden_size = 0;  // 0 = default: llama 256-aligned 8/3*hidden, gpt_neox 4*hidden
  int64_t max_position_embeddings = 2048;
  double rotary_pct = 0.25;  // gpt_neox: rotary on int(head_dim * rotary_pct) features; llama: all
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;             // RMSNorm (llama) / LayerNorm (gpt_neox) epsilon
  double init_std = 0.02;             // normal(0, init_std) for linear and embedding weights
  bool tie_word_embeddings = false;   // the output head reuses the input embedding
  double dropout = 0.0;               // on the attention and MLP outputs (training only)
  bool gelu_tanh = false;             // gpt_neox: tanh GELU ("gelu_new") instead of erf ("gelu")
  bool use_parallel_residual = true;  // gpt_neox: x + attn(ln1(x)) + mlp(ln2(x))
  DType dtype = DType::f32;           // parameter dtype
  Device device = Device::host;       // meta: shapes only

  // Throws ConfigError naming the offending values (unknown arch, non-positive sizes, heads not
  // dividing hidden_size, kv heads not dividing heads, odd rotary dims, eps/std/dropout ranges).
  void validate() const;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_attention_heads; }
  int64_t ffn_size() const;
  int64_t rotary_dim() const;  // features rotated per head
};

}  // namespace nxd

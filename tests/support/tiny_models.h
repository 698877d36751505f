#pragma once
// The tests' tiny decoder models: two presets, and the few fields each test changes written out
// beside the call, so a test shows what is special about its model.
//
//   tiny_model(arch)   2 layers, hidden 32, 4 heads (Llama: 2 KV heads), FFN 48 (GPT-NeoX: 64),
//                      vocab 64, 32 positions, init_std 0.2
//   micro_model(arch)  2 layers, hidden 16, 4 heads (no GQA), FFN 24, vocab 32, 16 positions,
//                      init_std 0.3 (large enough that every block matters)
//   tiny_gqa_llama(L)  tiny_model("llama") with L layers, 16 positions and NxD's init
//
// GPT-NeoX gets rotary_pct 0.5 (an even count of rotary features at head_dim 4 and 8); Llama
// rotates every feature and keeps the default.
#include <cstdint>
#include <string>
#include <vector>

#include "nxd/layers/models/config.h"
#include "nxd/runtime/rng.h"
#include "nxd/runtime/tensor.h"

namespace nxd::testing {

inline ModelConfig tiny_model(const std::string& arch = "llama") {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 64;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_kv_heads = arch == "llama" ? 2 : 0;
  c.ffn_hidden_size = arch == "llama" ? 48 : 64;
  c.max_position_embeddings = 32;
  if (arch == "gpt_neox") c.rotary_pct = 0.5;
  c.init_std = 0.2;
  return c;
}

inline ModelConfig micro_model(const std::string& arch = "llama") {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 32;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 24;
  c.max_position_embeddings = 16;
  if (arch == "gpt_neox") c.rotary_pct = 0.5;
  c.init_std = 0.3;
  return c;
}

// The quantization tests' model: 4 layers, hidden 128, FFN 256, vocab 256, 64 positions, Hugging
// Face's init_std 0.02 (larger ones make a random model's logits chaotic); Llama with 2 KV heads.
inline ModelConfig quality_model(const std::string& arch) {
  ModelConfig c = tiny_model(arch);
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.num_attention_heads = 4;
  c.num_kv_heads = arch == "llama" ? 2 : 0;
  c.ffn_hidden_size = 256;
  c.num_layers = 4;
  c.max_position_embeddings = 64;
  c.init_std = 0.02;
  return c;
}

inline ModelConfig tiny_gqa_llama(int64_t layers = 2) {
  ModelConfig c = tiny_model("llama");
  c.num_layers = layers;
  c.max_position_embeddings = 16;
  c.init_method = InitMethod::nxd;
  return c;
}

// n ids uniform in [0, vocab) from RngStream{seed, stream}.
inline std::vector<int64_t> id_sequence(int64_t n, int64_t vocab, uint64_t seed,
                                        uint64_t stream = 77) {
  std::vector<int64_t> v(n);
  RngStream s{seed, stream};
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int64_t>(s.uniform_f64(i) * vocab);
  return v;
}

// [4, 16] ids uniform in [0, vocab) from RngStream{seed, stream}.
inline Tensor random_ids(uint64_t seed, uint64_t stream, int64_t vocab) {
  return from_vector<int64_t>(id_sequence(4 * 16, vocab, seed, stream), {4, 16});
}

}  // namespace nxd::testing

#pragma once
// The benches' ~125M Llama: nxd-bench-inference times and exports it (the serving bench,
// bench/llamacpp/compare_serve.py, serves that export), nxd-bench-decode-step runs its engine
// step. 12 layers, hidden 768, 12 heads, 4 KV heads, FFN 2048, vocabulary 32000.
#include <cstdint>

#include "nxd/layers/models/config.h"

namespace nxd::bench {

inline ModelConfig llama_125m(int64_t max_positions) {
  ModelConfig c;
  c.arch = "llama";
  c.vocab_size = 32000;
  c.hidden_size = 768;
  c.num_layers = 12;
  c.num_attention_heads = 12;
  c.num_kv_heads = 4;
  c.ffn_hidden_size = 2048;
  c.max_position_embeddings = max_positions;
  c.init_std = 0.02;
  return c;
}

}  // namespace nxd::bench

#pragma once
// Shared by the optimizer and training-API tests: a tiny grouped-query Llama config and seeded
// random token batches.
#include <cstdint>
#include <vector>

#include "nxd/layers/models/config.h"
#include "nxd/runtime/rng.h"
#include "nxd/runtime/tensor.h"

namespace nxd::testing {

// vocab 64, hidden 32, 4 heads over 2 KV heads, ffn 48, 16 positions, NxD's init.
inline ModelConfig tiny_gqa_llama(int64_t layers = 2) {
  ModelConfig c;
  c.vocab_size = 64;
  c.num_layers = layers;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden_size = 48;
  c.max_position_embeddings = 16;
  c.init_method = InitMethod::nxd;
  return c;
}

// [4, 16] ids uniform in [0, vocab) from RngStream{seed, stream}.
inline Tensor random_ids(uint64_t seed, uint64_t stream, int64_t vocab) {
  std::vector<int64_t> v(4 * 16);
  RngStream s{seed, stream};
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(s.uniform_f64(i) * vocab);
  return from_vector<int64_t>(v, {4, 16});
}

}  // namespace nxd::testing

// Model FLOPs per token (plan.h): the useful work MFU counts.
#include "nxd/train_app/plan.h"

namespace nxd::train_app {

// Model FLOPs of one token's forward and backward, the useful work MFU counts (Megatron-LM's
// num_floating_point_operations, without recomputation): 6 per weight of the matmuls (the
// vocabulary projection once: the input embedding is a lookup) and the attention products,
// Q K^T and P V, of the causal half of the S x S scores: 3 x 2 x 2 x h x S / 2 = 6 h S per layer.
// The sim device charges at least that (recomputation, the fused kernel's whole diagonal blocks,
// rooflines below peak), so MFU stays at or under 1. A mixture-of-experts layer counts the
// weights one token uses: the router and top_k experts (Mixtral 8x7B: its 12.9B active of 46.7B).
double model_flops_per_token(const TrainConfig& c) {
  const auto& m = c.model;
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.ffn_hidden_size);
  const double kv =
      static_cast<double>(m.num_kv_heads) / static_cast<double>(m.num_attention_heads);
  const double mlp = (m.arch == "gpt_neox" ? 2.0 : 3.0) * h * f;
  const double layer = h * h * (2.0 + 2.0 * kv) + mlp;
  const double head = static_cast<double>(m.vocab_size) * h;
  double weights = static_cast<double>(m.num_layers) * layer + head;
  // a MoE layer's MLP: the router and the top_k experts a token reaches (its active weights)
  for (int64_t l = 0; l < m.num_layers; ++l)
    if (m.moe.is_moe_layer(l))
      weights +=
          static_cast<double>(m.moe.top_k - 1) * mlp + h * static_cast<double>(m.moe.num_experts);
  return 6.0 * weights +
         6.0 * static_cast<double>(m.num_layers) * h * static_cast<double>(c.data.seq_length);
}

}  // namespace nxd::train_app

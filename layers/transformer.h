#pragma once
// Transformer building blocks: causal self-attention (grouped-query, rotary) and the two MLPs.
//
// Shapes: x [B, S, hidden]; H query heads and Hkv key/value heads of size D; Hkv divides H and
// query head h reads kv head h / (H / Hkv).
//
// CausalSelfAttention, separate layout (Llama: q_proj, k_proj, v_proj, o_proj):
//   q = x Wq^T [+bq] viewed [B,S,H,D] -> [B,H,S,D];  k, v likewise with Hkv heads
//   q, k = rotary(q), rotary(k) on the first rotary_dim features of each head
//          (pairs (i, i + r/2), angle pos * theta^(-2i/r), HF's rotate_half convention)
//   o = softmax(q k^T / sqrt(D) + causal mask) v        [B,H,S,D] -> [B,S,H*D]
//   y = o Wo^T [+bo]
// Fused layout (GPT-NeoX: query_key_value [3*H*D, hidden], dense): the fused output is viewed
// [B,S,H,3D] and head h's q, k, v are features [0,D), [D,2D), [2D,3D) of its 3D block, exactly as
// HF GPTNeoXAttention (so its checkpoints load as is). The fused layout needs Hkv == H.
//
// Mlp (GPT-NeoX: dense_h_to_4h, dense_4h_to_h):  y = W2 gelu(W1 x + b1) + b2
// GatedMlp (Llama: gate_proj, up_proj, down_proj): y = Wd (silu(Wg x) * (Wu x))
#include <cstdint>

#include "nxd/layers/basic.h"

namespace nxd {

// The pieces of attention shared with the tensor-parallel layers (which call them with their
// local head counts):
// [B, S, heads*D] -> [B, heads, S, D] (a view).
Tensor split_heads(const Tensor& x, int64_t heads, int64_t head_dim);
// GPT-NeoX's fused projection [B, S, heads*3D] -> q, k, v [B, heads, S, D] (views; one graph node).
std::vector<Tensor> split_fused_qkv(const Tensor& qkv, int64_t heads, int64_t head_dim);
// q [B,H,S,D], k/v [B,Hkv,S,D] -> rotary on the first rotary_dim features of q and k (0: none),
// causal softmax(q k^T / sqrt(D)) v, heads merged -> [B, S, H*D] (free: the attention op writes
// [B,S,H,D] memory).
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t rotary_dim,
                        double rope_theta, int64_t position_offset);

enum class QkvLayout { separate, fused_neox };

struct AttentionOptions {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // 0 = num_heads
  int64_t head_dim = 0;      // 0 = hidden_size / num_heads
  int64_t rotary_dim = -1;   // -1 = head_dim; 0 = no rotary
  double rope_theta = 10000.0;
  bool bias = false;  // biases on the projections (GPT-NeoX: true)
  QkvLayout layout = QkvLayout::separate;
  double init_std = 0.02;
  ParamOptions param;
};

class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(const AttentionOptions& opts);
  // x [B,S,hidden] -> [B,S,hidden]; positions start at position_offset.
  Tensor forward(const Tensor& x, int64_t position_offset = 0) const;

  int64_t num_heads() const { return h_; }
  int64_t num_kv_heads() const { return hkv_; }
  int64_t head_dim() const { return d_; }
  int64_t rotary_dim() const { return rot_; }
  QkvLayout layout() const { return layout_; }

 private:
  int64_t hidden_, h_, hkv_, d_, rot_;
  double theta_;
  QkvLayout layout_;
  std::shared_ptr<Linear> q_, k_, v_, qkv_, o_;
};

struct MlpOptions {
  bool bias = true;
  GeluApprox gelu = GeluApprox::none;  // HF "gelu" (erf); tanh = "gelu_new"
  double init_std = 0.02;
  ParamOptions param;
};

// GELU MLP with GPT-NeoX's names (dense_h_to_4h, dense_4h_to_h).
class Mlp : public Module {
 public:
  Mlp(int64_t hidden_size, int64_t ffn_hidden_size, const MlpOptions& opts = {});
  Tensor forward(const Tensor& x) const;

 private:
  GeluApprox gelu_;
  std::shared_ptr<Linear> fc_in_, fc_out_;
};

struct GatedMlpOptions {
  bool bias = false;
  double init_std = 0.02;
  ParamOptions param;
};

// SwiGLU MLP with Llama's names (gate_proj, up_proj, down_proj).
class GatedMlp : public Module {
 public:
  GatedMlp(int64_t hidden_size, int64_t ffn_hidden_size, const GatedMlpOptions& opts = {});
  Tensor forward(const Tensor& x) const;

 private:
  std::shared_ptr<Linear> gate_, up_, down_;
};

}  // namespace nxd

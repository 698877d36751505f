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
//
// Every projection is a parallel layer (layers/parallel/) over the parallel_state TP group at
// construction (a group of one rank without parallel_state: exactly the plain layers, same names,
// same values, same ops). Each rank holds the slice of every weight the one-rank module creates:
//   - q/k/v_proj: GQAQKVColumnParallelLinear (its q_proj/k_proj/v_proj registered here); K/V heads
//     replicated kv_size_multiplier times (which must be max(1, tp / num_kv_heads) so each rank's
//     query heads read its own KV heads); query_key_value: ColumnParallelLinear, contiguous rows
//     (HF's per-head [q|k|v] blocks make every rank own whole heads, q, k and v of each);
//     o_proj/dense: RowParallelLinear (input_is_parallel). Attention runs on the local heads.
//   - Mlp/GatedMlp: dense_h_to_4h, gate_proj, up_proj ColumnParallelLinear (gather_output=false),
//     dense_4h_to_h, down_proj RowParallelLinear (input_is_parallel).
// With sequence_parallel (TP > 1) the input and output are this rank's sequence shard
// [B, S/tp, hidden]: the column layers all-gather it and the row layers reduce-scatter
// (docs/NXD_INTERNALS.md); the row biases are then tagged sequence_parallel_enabled (sum their
// gradients over TP after backward: allreduce_sequence_parallel_gradients). Without it input and
// output are full and duplicated.
#include <cstdint>

#include "nxd/layers/basic.h"
#include "nxd/layers/init_scheme.h"
#include "nxd/layers/models/kv_cache.h"
#include "nxd/runtime/rope_scaling.h"

namespace nxd {

class ColumnParallelLinear;
class Communicator;
class RowParallelLinear;
class GQAQKVColumnParallelLinear;

// The pieces of attention shared with the tensor-parallel layers (which call them with their
// local head counts):
// [B, S, heads*D] -> [B, heads, S, D] (a view).
Tensor split_heads(const Tensor& x, int64_t heads, int64_t head_dim);
// GPT-NeoX's fused projection [B, S, heads*3D] -> q, k, v [B, heads, S, D] (views; one graph node).
std::vector<Tensor> split_fused_qkv(const Tensor& qkv, int64_t heads, int64_t head_dim);
// q [B,H,S,D], k/v [B,Hkv,S,D] -> rotary on the first rotary_dim features of q and k (0: none),
// causal softmax(q k^T / sqrt(D)) v, heads merged -> [B, S, H*D] (free: the attention op writes
// [B,S,H,D] memory). options.recompute: the attention core runs under autograd::recompute
// (selective activation recomputation: its saved state is recomputed from q, k, v in backward).
// options.context_parallel: q, k, v are this rank's rows of the sequence (layers/parallel/
// context_parallel.h): rotary at their global positions and ring attention over the group.
struct CausalAttentionOptions {
  int64_t rotary_dim = 0;  // 0: no rotary
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t position_offset = 0;  // the position of the first row
  bool recompute = false;
  Communicator* context_parallel = nullptr;  // null: none
  // Packed documents (packed_documents.h): each token's position in its document [B, S'] (S' <= S:
  // extended over padding); rotary at those positions and attention within documents. Undefined:
  // one sequence from position_offset. Not with context_parallel.
  Tensor positions;
  // > 0: sliding-window attention, each query sees its last `window` positions (itself
  // included; transformers' sliding_window). Not with context_parallel.
  int64_t window = 0;
};
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                        const CausalAttentionOptions& opts);

enum class QkvLayout { separate, fused_neox };

struct AttentionOptions {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // 0 = num_heads
  int64_t head_dim = 0;      // 0 = hidden_size / num_heads
  int64_t rotary_dim = -1;   // -1 = head_dim; 0 = no rotary
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // transformers' rope_scaling (linear, llama3)
  bool bias = false;         // biases on the projections (GPT-NeoX: true)
  bool qkv_bias = false;     // (separate layout) biases on q/k/v_proj only (Qwen2)
  // (separate layout) Qwen3's q_norm and k_norm: an RMSNorm [head_dim] on every query and key
  // head after the projection, before rotary. Under TP each rank holds the whole weights and
  // normalizes its own heads: their gradients are partial sums, tagged sequence_parallel_enabled
  // so that allreduce_sequence_parallel_gradients sums them over TP.
  bool qk_norm = false;
  double qk_norm_eps = 1e-6;
  int64_t sliding_window = 0;  // > 0: sliding-window attention (CausalAttentionOptions::window)
  QkvLayout layout = QkvLayout::separate;
  InitScheme init;  // projection weights and biases (nxd_layers' init_scheme.h)
  ParamOptions param;
  bool sequence_parallel = false;  // (TP > 1) x and the output are sequence shards
  int64_t kv_size_multiplier = 1;  // (separate layout) K/V replication over TP
  // Selective activation recomputation: keep only q, k, v and recompute the attention core
  // (scores, softmax, PV) in backward.
  bool recompute_core = false;
  // Context parallelism (a group of more than one rank; layers/parallel/context_parallel.h): x is
  // this rank's rows of the sequence (its two balanced chunks), rotary uses their global
  // positions and attention is ring attention over the group. The group must outlive the layer.
  std::shared_ptr<Communicator> context_parallel_group;
};

class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(const AttentionOptions& opts);
  // x [B,S,hidden] -> [B,S,hidden]; positions start at position_offset.
  Tensor forward(const Tensor& x, int64_t position_offset = 0) const;
  // The KV-cache path (forward only, no graph; not under sequence parallelism): x [B,S,hidden]
  // at the per-row positions of `step` (kv_cache.h); writes this step's rotated K and V into
  // k_cache, v_cache [Bmax, local_kv_heads, L, D] in place and attends each token to its row's
  // cache positions [0, p] -> [B,S,hidden] (padding rows: the output projection of zeros).
  Tensor forward_cached(const Tensor& x, const CacheStep& step, const Tensor& k_cache,
                        const Tensor& v_cache) const;

  int64_t num_heads() const { return num_heads_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t rotary_dim() const { return rotary_dim_; }
  QkvLayout layout() const { return layout_; }
  // Heads computed on this rank (num_heads() / tp; kv: num_kv_heads() * multiplier / tp).
  int64_t local_heads() const { return local_heads_; }
  int64_t local_kv_heads() const { return local_kv_heads_; }

 private:
  void build_separate(const AttentionOptions& o);
  void build_fused(const AttentionOptions& o);
  std::vector<Tensor> project(const Tensor& x) const;  // q, k, v [B, heads, S, D] (local heads)
  CausalAttentionOptions core_options(int64_t position_offset) const;
  // [B, S, heads*D] -> [B, heads, S, D], through `norm` (q_norm / k_norm) when there is one
  static Tensor heads(const Tensor& x, int64_t heads, int64_t head_dim, const RMSNorm* norm);
  int64_t hidden_, num_heads_, num_kv_heads_, head_dim_, rotary_dim_;
  double rope_theta_;
  RopeScaling rope_scaling_;
  int64_t window_ = 0;
  bool recompute_core_ = false;
  QkvLayout layout_;
  int64_t local_heads_, local_kv_heads_;
  bool sequence_parallel_ = false;
  std::shared_ptr<Communicator> context_parallel_;  // null: none
  // the separate layout's q/k/v_proj, or the fused layout's query_key_value; then o_proj/dense
  std::shared_ptr<GQAQKVColumnParallelLinear> qkv_proj_;
  std::shared_ptr<ColumnParallelLinear> fused_qkv_proj_;
  std::shared_ptr<RowParallelLinear> out_proj_;
  std::shared_ptr<RMSNorm> q_norm_, k_norm_;  // qk_norm
};

struct MlpOptions {
  bool bias = true;
  GeluApprox gelu = GeluApprox::none;  // HF "gelu" (erf); tanh = "gelu_new"
  InitScheme init;                     // projection weights and biases (nxd_layers' init_scheme.h)
  ParamOptions param;
  bool sequence_parallel = false;  // (TP > 1) x and the output are sequence shards
};

// GELU MLP with GPT-NeoX's names (dense_h_to_4h, dense_4h_to_h).
class Mlp : public Module {
 public:
  Mlp(int64_t hidden_size, int64_t ffn_hidden_size, const MlpOptions& opts = {});
  Tensor forward(const Tensor& x) const;

 private:
  GeluApprox gelu_;
  std::shared_ptr<ColumnParallelLinear> fc_in_;
  std::shared_ptr<RowParallelLinear> fc_out_;
};

struct GatedMlpOptions {
  bool bias = false;
  // The gate's activation (transformers' hidden_act): silu (SwiGLU, the fused swiglu op), gelu
  // (erf) or gelu_tanh (gelu_new / gelu_pytorch_tanh).
  enum class Act { silu, gelu, gelu_tanh } act = Act::silu;
  InitScheme init;  // projection weights and biases (nxd_layers' init_scheme.h)
  ParamOptions param;
  bool sequence_parallel = false;  // (TP > 1) x and the output are sequence shards
};

// SwiGLU MLP with Llama's names (gate_proj, up_proj, down_proj).
class GatedMlp : public Module {
 public:
  GatedMlp(int64_t hidden_size, int64_t ffn_hidden_size, const GatedMlpOptions& opts = {});
  Tensor forward(const Tensor& x) const;

 private:
  GatedMlpOptions::Act act_ = GatedMlpOptions::Act::silu;
  Tensor gated(const Tensor& g, const Tensor& u) const;
  std::shared_ptr<ColumnParallelLinear> gate_, up_;
  std::shared_ptr<RowParallelLinear> down_;
};

}  // namespace nxd

#include "nxd/layers/transformer.h"

#include <array>

#include "nxd/autograd/function.h"
#include "nxd/autograd/ops/inference.h"
#include "nxd/layers/packed_documents.h"
#include "nxd/layers/parallel/context_parallel.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/parallel/qkv.h"

namespace nxd {

namespace {
// The options of a block's projections, from the block's options `o` (AttentionOptions,
// MlpOptions, GatedMlpOptions: bias, init, param, sequence_parallel): the column
// (gather_output=false; ColumnParallelLinear or GQAQKVColumnParallelLinear) and row
// (input_is_parallel; it writes into the residual stream: scaled under scaled_normal) halves of a
// TP region.
template <class Column = ColumnParallelLinearOptions, class O>
Column column_options(const O& o) {
  return Column{.bias = o.bias,
                .gather_output = false,
                .sequence_parallel_enabled = o.sequence_parallel,
                .weight_init = o.init.weight(),
                .bias_init = o.init.bias(),
                .param = o.param};
}
template <class O>
RowParallelLinearOptions row_options(const O& o) {
  return {.bias = o.bias,
          .input_is_parallel = true,
          .sequence_parallel_enabled = o.sequence_parallel,
          .weight_init = o.init.weight(WeightRole::residual_output),
          .bias_init = o.init.bias(),
          .param = o.param};
}
}  // namespace

CausalSelfAttention::CausalSelfAttention(const AttentionOptions& o)
    : Module("CausalSelfAttention"),
      hidden_(o.hidden_size),
      num_heads_(o.num_heads),
      num_kv_heads_(o.num_kv_heads > 0 ? o.num_kv_heads : o.num_heads),
      head_dim_(o.head_dim > 0 ? o.head_dim : (o.num_heads > 0 ? o.hidden_size / o.num_heads : 0)),
      rotary_dim_(o.rotary_dim < 0 ? head_dim_ : o.rotary_dim),
      rope_theta_(o.rope_theta),
      rope_scaling_(o.rope_scaling),
      window_(o.sliding_window),
      recompute_core_(o.recompute_core),
      layout_(o.layout),
      local_heads_(num_heads_),
      local_kv_heads_(num_kv_heads_),
      sequence_parallel_(o.sequence_parallel) {
  const int64_t h = num_heads_, hkv = num_kv_heads_, d = head_dim_, r = rotary_dim_;
  NXD_CHECK(hidden_ > 0 && h > 0 && d > 0,
            "[CausalSelfAttention] need positive sizes, got hidden=", hidden_, " heads=", h,
            " head_dim=", d);
  NXD_CHECK(o.head_dim > 0 || hidden_ % h == 0, "[CausalSelfAttention] num_heads=", h,
            " does not divide hidden_size=", hidden_);
  NXD_CHECK(h % hkv == 0, "[CausalSelfAttention] num_kv_heads=", hkv,
            " does not divide num_heads=", h);
  NXD_CHECK(r >= 0 && r <= d && r % 2 == 0, "[CausalSelfAttention] rotary_dim=", r,
            " must be even and within head_dim=", d);
  NXD_CHECK(layout_ == QkvLayout::separate || hkv == h,
            "[CausalSelfAttention] the fused GPT-NeoX layout needs num_kv_heads == num_heads, got ",
            hkv, " vs ", h);
  NXD_CHECK(window_ >= 0, "[CausalSelfAttention] sliding_window must be >= 0, got ", window_);
  NXD_CHECK(layout_ == QkvLayout::separate || (!o.qkv_bias && !o.qk_norm),
            "[CausalSelfAttention] qkv_bias and qk_norm are for the separate layout");
  if (o.context_parallel_group && o.context_parallel_group->size() > 1)
    context_parallel_ = o.context_parallel_group;
  NXD_CHECK(!(context_parallel_ && window_ > 0), "[CausalSelfAttention] sliding_window=", window_,
            " is not supported with context parallelism (context parallel size ",
            context_parallel_ ? context_parallel_->size() : 1, ")");
  if (layout_ == QkvLayout::separate)
    build_separate(o);
  else
    build_fused(o);
}

void CausalSelfAttention::build_separate(const AttentionOptions& o) {
  const int64_t h = num_heads_, hkv = num_kv_heads_, d = head_dim_;
  auto qo = column_options<GQAQKVColumnParallelLinearOptions>(o);
  qo.bias = o.bias || o.qkv_bias;
  qo.kv_size_multiplier = o.kv_size_multiplier;
  qo.head_dim = d;
  qkv_proj_ = std::make_shared<GQAQKVColumnParallelLinear>(hidden_, h * d, hkv * d, qo);
  local_heads_ = qkv_proj_->local_q_size() / d;
  local_kv_heads_ = qkv_proj_->local_kv_size() / d;
  // Rank r computes query heads [r*hl, (r+1)*hl), which read KV heads [r*hl/g, ...) (g = h/hkv);
  // its KV shard, block r/m of the unreplicated heads, is exactly those only when
  // m == max(1, tp/hkv).
  const int64_t tp = h / local_heads_, m = o.kv_size_multiplier, need = hkv >= tp ? 1 : tp / hkv;
  NXD_CHECK_SHAPE(m == need, "[CausalSelfAttention] kv_size_multiplier=", m, " with ", hkv,
                  " key/value heads at tensor parallel size ", tp,
                  " gives ranks KV heads their query heads do not read: it must be max(1, tp / "
                  "num_kv_heads) = ",
                  need);
  register_module("q_proj", qkv_proj_->q_proj());
  register_module("k_proj", qkv_proj_->k_proj());
  register_module("v_proj", qkv_proj_->v_proj());
  out_proj_ = register_module("o_proj",
                              std::make_shared<RowParallelLinear>(h * d, hidden_, row_options(o)));
  if (o.qk_norm) {
    const RMSNormOptions no{
        .eps = o.qk_norm_eps, .sequence_parallel_enabled = tp > 1, .param = o.param};
    q_norm_ = register_module("q_norm", std::make_shared<RMSNorm>(d, no));
    k_norm_ = register_module("k_norm", std::make_shared<RMSNorm>(d, no));
  }
}

void CausalSelfAttention::build_fused(const AttentionOptions& o) {
  const int64_t h = num_heads_, d = head_dim_;
  // HF's per-head [q|k|v] blocks: contiguous rows give every rank whole heads
  fused_qkv_proj_ = register_module("query_key_value", std::make_shared<ColumnParallelLinear>(
                                                           hidden_, 3 * h * d, column_options(o)));
  const int tp = fused_qkv_proj_->tp_size();
  NXD_CHECK_SHAPE(h % tp == 0, "[CausalSelfAttention] ", h,
                  " attention heads are not divisible by tensor parallel size ", tp);
  local_heads_ = local_kv_heads_ = h / tp;
  out_proj_ =
      register_module("dense", std::make_shared<RowParallelLinear>(h * d, hidden_, row_options(o)));
}

Tensor split_heads(const Tensor& x, int64_t heads, int64_t head_dim) {
  NXD_CHECK_SHAPE(x.dim() == 3 && x.size(2) == heads * head_dim, "[split_heads] expected [B,S,",
                  heads * head_dim, "], got ", x.desc());
  return transpose(view(x, {x.size(0), x.size(1), heads, head_dim}), 1, 2);
}

std::vector<Tensor> split_fused_qkv(const Tensor& qkv, int64_t heads, int64_t head_dim) {
  NXD_CHECK_SHAPE(qkv.dim() == 3 && qkv.size(2) == 3 * heads * head_dim,
                  "[split_fused_qkv] expected [B,S,", 3 * heads * head_dim, "], got ", qkv.desc());
  Tensor x = view(qkv, {qkv.size(0), qkv.size(1), heads, 3 * head_dim});
  // one split node: its backward writes the three gradients into one buffer
  std::vector<Tensor> parts = split(x, {head_dim, head_dim, head_dim}, 3);
  for (auto& p : parts) p = transpose(p, 1, 2);
  return parts;
}

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                        const CausalAttentionOptions& o) {
  Communicator* cp = o.context_parallel;
  Tensor docs;  // packed documents: positions [B, S]
  if (o.positions.defined()) {
    NXD_CHECK(!cp, "[causal_attention] packed documents (positions ", o.positions.desc(),
              ") with context parallelism: not supported (context_parallel_size 1 packs)");
    NXD_CHECK(o.position_offset == 0, "[causal_attention] packed documents with position_offset ",
              o.position_offset);
    NXD_CHECK_SHAPE(o.positions.size(0) == q.size(0), "[causal_attention] positions ",
                    o.positions.desc(), " for q ", q.desc());
    docs = extend_document_positions(o.positions, q.size(2));
  }
  Tensor qr = q, kr = k;
  if (o.rotary_dim > 0) {
    RotaryOptions ro;
    ro.rotary_dim = o.rotary_dim;
    ro.base = o.rope_theta;
    ro.position_offset = o.position_offset;
    ro.scaling = o.rope_scaling;
    if (docs.defined()) {
      qr = rotary_at_positions(q, docs, ro);
      kr = rotary_at_positions(k, docs, ro);
    } else {
      qr = cp ? context_parallel_rotary(q, ro, *cp) : rotary(q, ro);
      kr = cp ? context_parallel_rotary(k, ro, *cp) : rotary(k, ro);
    }
  }
  NXD_CHECK(!(cp && o.window > 0), "[causal_attention] a sliding window (", o.window,
            ") is not supported with context parallelism");
  NXD_CHECK(!(docs.defined() && o.window > 0), "[causal_attention] a sliding window (", o.window,
            ") is not supported with packed documents (data packing)");
  auto core = [cp, docs, window = o.window](const Tensor& a, const Tensor& b, const Tensor& c) {
    if (docs.defined()) return document_attention(a, b, c, docs);
    return cp ? ring_attention(a, b, c, *cp)
              : scaled_dot_product_attention(a, b, c,
                                             SdpaOptions{.causal = true, .window = window});
  };
  Tensor out = o.recompute ? autograd::recompute(
                                 [core](const std::vector<Tensor>& x) -> std::vector<Tensor> {
                                   return {core(x[0], x[1], x[2])};
                                 },
                                 {qr, kr, v})[0]
                           : core(qr, kr, v);  // [B,H,S,D]
  return reshape(transpose(out, 1, 2), {q.size(0), q.size(2), q.size(1) * q.size(3)});
}

CausalAttentionOptions CausalSelfAttention::core_options(int64_t position_offset) const {
  return {.rotary_dim = rotary_dim_,
          .rope_theta = rope_theta_,
          .rope_scaling = rope_scaling_,
          .position_offset = position_offset,
          .recompute = recompute_core_,
          .context_parallel = context_parallel_.get(),
          .positions = current_document_positions(),
          .window = window_};
}

Tensor CausalSelfAttention::heads(const Tensor& x, int64_t heads, int64_t head_dim,
                                  const RMSNorm* norm) {
  if (!norm) return split_heads(x, heads, head_dim);
  NXD_CHECK_SHAPE(x.dim() == 3 && x.size(2) == heads * head_dim,
                  "[CausalSelfAttention] expected [B,S,", heads * head_dim, "], got ", x.desc());
  return transpose(norm->forward(view(x, {x.size(0), x.size(1), heads, head_dim})), 1, 2);
}

std::vector<Tensor> CausalSelfAttention::project(const Tensor& x) const {
  NXD_CHECK_SHAPE(x.dim() == 3 && x.size(2) == hidden_, "[CausalSelfAttention] expected x [B,S",
                  sequence_parallel_ ? "/tp" : "", ",", hidden_, "], got ", x.desc());
  // q, k, v as [B, heads, S, D]: this rank's heads (all of them at TP 1)
  if (fused_qkv_proj_) return split_fused_qkv(fused_qkv_proj_->forward(x), local_heads_, head_dim_);
  std::array<Tensor, 3> p = qkv_proj_->forward(x);
  return {heads(p[0], local_heads_, head_dim_, q_norm_.get()),
          heads(p[1], local_kv_heads_, head_dim_, k_norm_.get()),
          split_heads(p[2], local_kv_heads_, head_dim_)};
}

Tensor CausalSelfAttention::forward(const Tensor& x, int64_t position_offset) const {
  std::vector<Tensor> qkv = project(x);
  return out_proj_->forward(
      causal_attention(qkv[0], qkv[1], qkv[2], core_options(position_offset)));
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, const CacheStep& step,
                                           const Tensor& k_cache, const Tensor& v_cache) const {
  NXD_CHECK(!sequence_parallel_,
            "[CausalSelfAttention::forward_cached] needs a model built without sequence "
            "parallelism (set sequence_parallel=false for inference)");
  NXD_CHECK(!context_parallel_,
            "[CausalSelfAttention::forward_cached] needs a model built without context "
            "parallelism (context parallel size ",
            context_parallel_ ? context_parallel_->size() : 1, ")");
  NXD_CHECK(!current_document_positions().defined(),
            "[CausalSelfAttention::forward_cached] packed documents (a DocumentScope) on the "
            "KV-cache path: not supported");
  const bool paged = step.block_tables.defined();
  NXD_CHECK_SHAPE(
      k_cache.dim() == 4 && k_cache.size(1) == local_kv_heads_ && k_cache.size(3) == head_dim_,
      "[CausalSelfAttention::forward_cached] cache must be [", paged ? "num_blocks" : "Bmax", ", ",
      local_kv_heads_, ", ", paged ? "block_size" : "L", ", ", head_dim_, "], got ",
      k_cache.desc());
  std::vector<Tensor> qkv = project(x);
  Tensor q = qkv[0], k = qkv[1];
  if (rotary_dim_ > 0) {
    RotaryOptions ro;
    ro.rotary_dim = rotary_dim_;
    ro.base = rope_theta_;
    ro.scaling = rope_scaling_;
    q = rotary_at(q, step.start, ro);
    k = rotary_at(k, step.start, ro);
  }
  Tensor o;
  if (paged) {
    paged_kv_cache_write(k_cache, k, step.block_tables, step.start, step.lengths);
    paged_kv_cache_write(v_cache, qkv[2], step.block_tables, step.start, step.lengths);
    o = paged_attention(q, k_cache, v_cache, step.block_tables, step.start, step.lengths, 0.0,
                        window_);
  } else {
    kv_cache_write(k_cache, k, step.seq_ids, step.start, step.lengths);
    kv_cache_write(v_cache, qkv[2], step.seq_ids, step.start, step.lengths);
    o = cached_attention(q, k_cache, v_cache, step.seq_ids, step.start, step.lengths, 0.0, window_);
  }
  o = reshape(transpose(o, 1, 2), {x.size(0), x.size(1), local_heads_ * head_dim_});
  return out_proj_->forward(o);
}

Mlp::Mlp(int64_t hidden_size, int64_t ffn_hidden_size, const MlpOptions& o)
    : Module("Mlp"), gelu_(o.gelu) {
  fc_in_ = register_module("dense_h_to_4h", std::make_shared<ColumnParallelLinear>(
                                                hidden_size, ffn_hidden_size, column_options(o)));
  fc_out_ = register_module("dense_4h_to_h", std::make_shared<RowParallelLinear>(
                                                 ffn_hidden_size, hidden_size, row_options(o)));
}

Tensor Mlp::forward(const Tensor& x) const {
  return fc_out_->forward(gelu(fc_in_->forward(x), gelu_));
}

GatedMlp::GatedMlp(int64_t hidden_size, int64_t ffn_hidden_size, const GatedMlpOptions& o)
    : Module("GatedMlp"), act_(o.act) {
  const auto co = column_options(o);
  gate_ = register_module("gate_proj",
                          std::make_shared<ColumnParallelLinear>(hidden_size, ffn_hidden_size, co));
  up_ = register_module("up_proj",
                        std::make_shared<ColumnParallelLinear>(hidden_size, ffn_hidden_size, co));
  down_ = register_module("down_proj", std::make_shared<RowParallelLinear>(
                                           ffn_hidden_size, hidden_size, row_options(o)));
}

Tensor GatedMlp::gated(const Tensor& g, const Tensor& u) const {
  using A = GatedMlpOptions::Act;
  if (act_ == A::silu) return swiglu(g, u);
  return mul(gelu(g, act_ == A::gelu_tanh ? GeluApprox::tanh : GeluApprox::none), u);
}

Tensor GatedMlp::forward(const Tensor& x) const {
  return down_->forward(gated(gate_->forward(x), up_->forward(x)));
}

}  // namespace nxd

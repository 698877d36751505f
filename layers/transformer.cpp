#include "nxd/layers/transformer.h"

#include <array>

#include "nxd/autograd/function.h"
#include "nxd/autograd/ops/inference.h"
#include "nxd/layers/parallel/context_parallel.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/parallel/qkv.h"

namespace nxd {

namespace {
// The options of a block's projections, from the block's options `o` (AttentionOptions,
// MlpOptions, GatedMlpOptions: bias, init, param, sequence_parallel): plain Linear, or the
// column (gather_output=false; ColumnParallelLinear or GQAQKVColumnParallelLinear) and row
// (input_is_parallel) halves of a TP region. residual_output: the projection writes into the
// residual stream (attention and MLP outputs: scaled under scaled_normal).
template <class O>
LinearOptions linear_options(const O& o, bool residual_output = false) {
  LinearOptions lo;
  lo.bias = o.bias;
  lo.weight_init = o.init.weight(residual_output);
  lo.bias_init = o.init.bias();
  lo.param = o.param;
  return lo;
}
template <class Column = ColumnParallelLinearOptions, class O>
Column column_options(const O& o) {
  Column co;
  co.bias = o.bias;
  co.gather_output = false;
  co.sequence_parallel_enabled = o.sequence_parallel;
  co.weight_init = o.init.weight();
  co.bias_init = o.init.bias();
  co.param = o.param;
  return co;
}
template <class O>
RowParallelLinearOptions row_options(const O& o) {
  RowParallelLinearOptions ro;
  ro.bias = o.bias;
  ro.input_is_parallel = true;
  ro.sequence_parallel_enabled = o.sequence_parallel;
  ro.weight_init = o.init.weight(/*residual_output=*/true);
  ro.bias_init = o.init.bias();
  ro.param = o.param;
  return ro;
}
}  // namespace

CausalSelfAttention::CausalSelfAttention(const AttentionOptions& o)
    : Module("CausalSelfAttention"),
      hidden_(o.hidden_size),
      h_(o.num_heads),
      hkv_(o.num_kv_heads > 0 ? o.num_kv_heads : o.num_heads),
      d_(o.head_dim > 0 ? o.head_dim : (o.num_heads > 0 ? o.hidden_size / o.num_heads : 0)),
      rot_(o.rotary_dim < 0 ? d_ : o.rotary_dim),
      theta_(o.rope_theta),
      rope_scaling_(o.rope_scaling),
      recompute_core_(o.recompute_core),
      layout_(o.layout),
      hl_(h_),
      hkvl_(hkv_) {
  NXD_CHECK(hidden_ > 0 && h_ > 0 && d_ > 0,
            "[CausalSelfAttention] need positive sizes, got hidden=", hidden_, " heads=", h_,
            " head_dim=", d_);
  NXD_CHECK(o.head_dim > 0 || hidden_ % h_ == 0, "[CausalSelfAttention] num_heads=", h_,
            " does not divide hidden_size=", hidden_);
  NXD_CHECK(h_ % hkv_ == 0, "[CausalSelfAttention] num_kv_heads=", hkv_,
            " does not divide num_heads=", h_);
  NXD_CHECK(rot_ >= 0 && rot_ <= d_ && rot_ % 2 == 0, "[CausalSelfAttention] rotary_dim=", rot_,
            " must be even and within head_dim=", d_);
  NXD_CHECK(layout_ == QkvLayout::separate || hkv_ == h_,
            "[CausalSelfAttention] the fused GPT-NeoX layout needs num_kv_heads == num_heads, got ",
            hkv_, " vs ", h_);
  if (o.context_parallel_group && o.context_parallel_group->size() > 1)
    cp_ = o.context_parallel_group;
  if (o.tensor_parallel) {
    build_parallel(o);
    return;
  }
  const LinearOptions lo = linear_options(o), out = linear_options(o, /*residual_output=*/true);
  if (layout_ == QkvLayout::separate) {
    q_ = register_module("q_proj", std::make_shared<Linear>(hidden_, h_ * d_, lo));
    k_ = register_module("k_proj", std::make_shared<Linear>(hidden_, hkv_ * d_, lo));
    v_ = register_module("v_proj", std::make_shared<Linear>(hidden_, hkv_ * d_, lo));
    o_ = register_module("o_proj", std::make_shared<Linear>(h_ * d_, hidden_, out));
  } else {
    qkv_ = register_module("query_key_value", std::make_shared<Linear>(hidden_, 3 * h_ * d_, lo));
    o_ = register_module("dense", std::make_shared<Linear>(h_ * d_, hidden_, out));
  }
}

void CausalSelfAttention::build_parallel(const AttentionOptions& o) {
  const char* op = "CausalSelfAttention";
  sp_ = o.sequence_parallel;
  const auto ro = row_options(o);
  if (layout_ == QkvLayout::separate) {
    auto qo = column_options<GQAQKVColumnParallelLinearOptions>(o);
    qo.kv_size_multiplier = o.kv_size_multiplier;
    qo.head_dim = d_;
    pqkv_ = std::make_shared<GQAQKVColumnParallelLinear>(hidden_, h_ * d_, hkv_ * d_, qo);
    hl_ = pqkv_->local_q_size() / d_;
    hkvl_ = pqkv_->local_kv_size() / d_;
    // Rank r computes query heads [r*hl, (r+1)*hl), which read KV heads [r*hl/g, ...) (g =
    // h/hkv); its KV shard, block r/m of the unreplicated heads, is exactly those only when
    // m == max(1, tp/hkv).
    const int64_t tp = h_ / hl_, m = o.kv_size_multiplier, need = hkv_ >= tp ? 1 : tp / hkv_;
    NXD_CHECK_SHAPE(m == need, "[", op, "] kv_size_multiplier=", m, " with ", hkv_,
                    " key/value heads at tensor parallel size ", tp,
                    " gives ranks KV heads their query heads do not read: it must be max(1, tp / "
                    "num_kv_heads) = ",
                    need);
    register_module("q_proj", pqkv_->q_proj());
    register_module("k_proj", pqkv_->k_proj());
    register_module("v_proj", pqkv_->v_proj());
    po_ = register_module("o_proj", std::make_shared<RowParallelLinear>(h_ * d_, hidden_, ro));
  } else {
    // HF's per-head [q|k|v] blocks: contiguous rows give every rank whole heads
    pfused_ = register_module("query_key_value", std::make_shared<ColumnParallelLinear>(
                                                     hidden_, 3 * h_ * d_, column_options(o)));
    const int tp = pfused_->tp_size();
    NXD_CHECK_SHAPE(h_ % tp == 0, "[", op, "] ", h_,
                    " attention heads are not divisible by tensor parallel size ", tp);
    hl_ = hkvl_ = h_ / tp;
    po_ = register_module("dense", std::make_shared<RowParallelLinear>(h_ * d_, hidden_, ro));
  }
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

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t rotary_dim,
                        double rope_theta, int64_t position_offset, bool recompute_core,
                        const RopeScaling& rope_scaling, Communicator* context_parallel) {
  Tensor qr = q, kr = k;
  if (rotary_dim > 0) {
    RotaryOptions ro;
    ro.rotary_dim = rotary_dim;
    ro.base = rope_theta;
    ro.position_offset = position_offset;
    ro.scaling = rope_scaling;
    qr = context_parallel ? context_parallel_rotary(q, ro, *context_parallel) : rotary(q, ro);
    kr = context_parallel ? context_parallel_rotary(k, ro, *context_parallel) : rotary(k, ro);
  }
  auto core = [context_parallel](const Tensor& a, const Tensor& b, const Tensor& c) {
    return context_parallel ? ring_attention(a, b, c, *context_parallel)
                            : scaled_dot_product_attention(a, b, c, /*causal=*/true);
  };
  Tensor o = recompute_core ? autograd::checkpoint(
                                  [core](const std::vector<Tensor>& x) -> std::vector<Tensor> {
                                    return {core(x[0], x[1], x[2])};
                                  },
                                  {qr, kr, v})[0]
                            : core(qr, kr, v);  // [B,H,S,D]
  return reshape(transpose(o, 1, 2), {q.size(0), q.size(2), q.size(1) * q.size(3)});
}

std::vector<Tensor> CausalSelfAttention::project(const Tensor& x) const {
  NXD_CHECK_SHAPE(x.dim() == 3 && x.size(2) == hidden_, "[CausalSelfAttention] expected x [B,S",
                  sp_ ? "/tp" : "", ",", hidden_, "], got ", x.desc());
  // q, k, v as [B, heads, S, D]: this rank's heads under tensor parallelism (hl_, hkvl_), else
  // all of them (hl_ == h_, hkvl_ == hkv_).
  std::vector<Tensor> qkv;
  if (layout_ == QkvLayout::separate) {
    std::array<Tensor, 3> p;
    if (pqkv_) {
      p = pqkv_->forward(x);
    } else {  // v, k, q: the graph order the layer has always had (it fixes dX's summation order)
      p[2] = v_->forward(x);
      p[1] = k_->forward(x);
      p[0] = q_->forward(x);
    }
    qkv = {split_heads(p[0], hl_, d_), split_heads(p[1], hkvl_, d_), split_heads(p[2], hkvl_, d_)};
  } else {
    qkv = split_fused_qkv(pfused_ ? pfused_->forward(x) : qkv_->forward(x), hl_, d_);
  }
  return qkv;
}

Tensor CausalSelfAttention::forward(const Tensor& x, int64_t position_offset) const {
  std::vector<Tensor> qkv = project(x);
  Tensor o = causal_attention(qkv[0], qkv[1], qkv[2], rot_, theta_, position_offset,
                              recompute_core_, rope_scaling_, cp_.get());
  return po_ ? po_->forward(o) : o_->forward(o);
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, const CacheStep& step,
                                           const Tensor& k_cache, const Tensor& v_cache) const {
  NXD_CHECK(!sp_,
            "[CausalSelfAttention::forward_cached] needs a model built without sequence "
            "parallelism (set sequence_parallel=false for inference)");
  NXD_CHECK(!cp_,
            "[CausalSelfAttention::forward_cached] needs a model built without context "
            "parallelism (context parallel size ",
            cp_ ? cp_->size() : 1, ")");
  NXD_CHECK_SHAPE(k_cache.dim() == 4 && k_cache.size(1) == hkvl_ && k_cache.size(3) == d_,
                  "[CausalSelfAttention::forward_cached] cache must be [Bmax, ", hkvl_, ", L, ", d_,
                  "], got ", k_cache.desc());
  std::vector<Tensor> qkv = project(x);
  Tensor q = qkv[0], k = qkv[1];
  if (rot_ > 0) {
    RotaryOptions ro;
    ro.rotary_dim = rot_;
    ro.base = theta_;
    ro.scaling = rope_scaling_;
    q = rotary_at(q, step.start, ro);
    k = rotary_at(k, step.start, ro);
  }
  kv_cache_write(k_cache, k, step.seq_ids, step.start, step.lengths);
  kv_cache_write(v_cache, qkv[2], step.seq_ids, step.start, step.lengths);
  Tensor o = cached_attention(q, k_cache, v_cache, step.seq_ids, step.start, step.lengths);
  o = reshape(transpose(o, 1, 2), {x.size(0), x.size(1), hl_ * d_});
  return po_ ? po_->forward(o) : o_->forward(o);
}

Mlp::Mlp(int64_t hidden_size, int64_t ffn_hidden_size, const MlpOptions& o)
    : Module("Mlp"), gelu_(o.gelu) {
  if (o.tensor_parallel) {
    pin_ = register_module("dense_h_to_4h", std::make_shared<ColumnParallelLinear>(
                                                hidden_size, ffn_hidden_size, column_options(o)));
    pout_ = register_module("dense_4h_to_h", std::make_shared<RowParallelLinear>(
                                                 ffn_hidden_size, hidden_size, row_options(o)));
    return;
  }
  const LinearOptions lo = linear_options(o);
  fc_in_ =
      register_module("dense_h_to_4h", std::make_shared<Linear>(hidden_size, ffn_hidden_size, lo));
  fc_out_ = register_module("dense_4h_to_h", std::make_shared<Linear>(ffn_hidden_size, hidden_size,
                                                                      linear_options(o, true)));
}

Tensor Mlp::forward(const Tensor& x) const {
  if (pin_) return pout_->forward(gelu(pin_->forward(x), gelu_));
  return fc_out_->forward(gelu(fc_in_->forward(x), gelu_));
}

GatedMlp::GatedMlp(int64_t hidden_size, int64_t ffn_hidden_size, const GatedMlpOptions& o)
    : Module("GatedMlp"), act_(o.act) {
  if (o.tensor_parallel) {
    const auto co = column_options(o);
    pgate_ = register_module(
        "gate_proj", std::make_shared<ColumnParallelLinear>(hidden_size, ffn_hidden_size, co));
    pup_ = register_module(
        "up_proj", std::make_shared<ColumnParallelLinear>(hidden_size, ffn_hidden_size, co));
    pdown_ = register_module("down_proj", std::make_shared<RowParallelLinear>(
                                              ffn_hidden_size, hidden_size, row_options(o)));
    return;
  }
  const LinearOptions lo = linear_options(o);
  gate_ = register_module("gate_proj", std::make_shared<Linear>(hidden_size, ffn_hidden_size, lo));
  up_ = register_module("up_proj", std::make_shared<Linear>(hidden_size, ffn_hidden_size, lo));
  down_ = register_module(
      "down_proj", std::make_shared<Linear>(ffn_hidden_size, hidden_size, linear_options(o, true)));
}

Tensor GatedMlp::gated(const Tensor& g, const Tensor& u) const {
  using A = GatedMlpOptions::Act;
  if (act_ == A::silu) return swiglu(g, u);
  return mul(gelu(g, act_ == A::gelu_tanh ? GeluApprox::tanh : GeluApprox::none), u);
}

Tensor GatedMlp::forward(const Tensor& x) const {
  if (pgate_) return pdown_->forward(gated(pgate_->forward(x), pup_->forward(x)));
  return down_->forward(gated(gate_->forward(x), up_->forward(x)));
}

}  // namespace nxd

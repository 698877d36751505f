#include "nxd/layers/parallel/qkv.h"

#include <map>
#include <utility>

#include "nxd/autograd/function.h"
#include "nxd/layers/parallel/lora.h"
#include "nxd/layers/parallel/mappings.h"
#include "nxd/layers/quantize.h"
#include "nxd/runtime/context.h"

namespace nxd {

using namespace tp_detail;

namespace {

// One projection's shard: "weight" [rows, in] and optional "bias" [rows], a block of the full
// [full_rows, in] weight starting at row `row0`.
class ProjectionShard : public ParallelModule, public QuantizableLinear {
 public:
  ProjectionShard(int64_t in, int64_t rows, int64_t full_rows, int64_t row0, bool bias,
                  const GQAQKVColumnParallelLinearOptions& o, const ParallelAttrs& attrs)
      : ParallelModule("ColumnParallelLinear") {
    const auto& p = o.param;
    register_parameter("weight", zeros({rows, in}, p.dtype, p.device),
                       with_region(o.weight_init.for_fan_in(in), {full_rows, in}, {row0, 0}));
    set_parallel_attrs("weight", attrs);
    if (bias) {
      register_parameter("bias", zeros({rows}, p.dtype, p.device),
                         with_region(o.bias_init.for_fan_in(in), {full_rows}, {row0}));
      set_parallel_attrs("bias", attrs);
    }
    lora_.style = LoraTarget::Style::column;
    lora_.in = in;
    lora_.out = full_rows;
    lora_.local_out = rows;
    lora_.out0 = row0;
    lora_.kv_replicas = attrs.kv_replicas;
    lora_.sequence_parallel = o.sequence_parallel_enabled;
    lora_.sequence_dimension = o.sequence_dimension;
    lora_.param = p;
  }
  // The groups are known once every projection is built.
  void set_groups(const std::shared_ptr<Communicator>& tp,
                  const std::shared_ptr<Communicator>& kv) {
    lora_.group = tp;
    lora_.kv_group = kv;
    lora_.sequence_parallel = lora_.sequence_parallel && tp->size() > 1;
  }
  bool lora_target(LoraTarget& t) const override {
    t = lora_;
    return true;
  }

 private:
  LoraTarget lora_;
};

const ProjectionShard& shard(const std::shared_ptr<ParallelModule>& m) {
  return static_cast<const ProjectionShard&>(*m);
}

Tensor param_or_none(const Module& m, const char* name) {
  for (auto& [n, t] : m.named_parameters(/*recurse=*/false))
    if (n == name) return t;
  return Tensor();
}

// The KV-replica groups, one split per (TP group, m) and rank (SPMD: every rank builds the same
// layers in the same order, so the collective split happens once on all of them).
struct KvGroupCache {
  std::map<std::pair<const Communicator*, int64_t>,
           std::pair<std::weak_ptr<Communicator>, std::shared_ptr<Communicator>>>
      groups;
};

std::shared_ptr<Communicator> kv_replica_group(const std::shared_ptr<Communicator>& tp, int64_t m) {
  auto& cache = current_context().ext<KvGroupCache>().groups;
  auto key = std::make_pair(tp.get(), m);
  auto it = cache.find(key);
  if (it != cache.end() && it->second.first.lock() == tp) return it->second.second;
  auto g = tp->split(static_cast<int>(tp->rank() / m), tp->rank());
  cache[key] = {tp, g};
  return g;
}

// The three projections at tp > 1 as one function (NxD §2.3/§2.6):
//   forward:  X_in = X (no SP) or all-gather(X) along the sequence dim (SP); q, k, v = X_in W^T + b
//   backward: [SP: re-gather X_in; only the local shard was saved]
//             dK|dV all-reduced over the KV-replica group when m > 1
//             dX_in = dQ W_q + (dK W_k + dV W_v) / m, then all-reduce over TP (no SP) or
//             reduce-scatter along the sequence dim (SP), f32 for bf16
//             dW = dY^T X_in, db = sum dY (with the group-summed dK, dV)
std::vector<Tensor> qkv_linear(const Tensor& x, const std::array<Tensor, 3>& w,
                               const std::array<Tensor, 3>& b, int64_t m, bool sp, int64_t seq_dim,
                               Communicator* tp, Communicator* kvg) {
  const bool has_bias = b[0].defined();
  std::vector<Tensor> in{x, w[0], w[1], w[2]};
  if (has_bias) in.insert(in.end(), {b[0], b[1], b[2]});
  const int64_t d = wrap_dim(seq_dim, x.dim(), "GQAQKVColumnParallelLinear");
  return autograd::custom(
      "gqa_qkv_column_parallel_linear", in,
      [has_bias, sp, d, tp](const std::vector<Tensor>& t) {
        Tensor xi = sp ? all_gather(*tp, t[0], d) : t[0];
        std::vector<Tensor> out;
        for (int i = 0; i < 3; ++i)
          out.push_back(linear(xi, t[1 + i], has_bias ? t[4 + i] : Tensor()));
        return out;
      },
      [xd = x.detach(), wq = w[0].detach(), wk = w[1].detach(), wv = w[2].detach(), has_bias, m, sp,
       d, tp, kvg, need_w = w[0].requires_grad()](const Grads& g) -> Grads {
        const int64_t qp = wq.size(0), kp = wk.size(0), in_f = wq.size(1);
        // a frozen weight (LoRA's base) gets no gradient: X is not re-gathered for it
        Tensor xi = sp && need_w ? all_gather(*tp, xd, d) : xd;
        Shape xs = xd.shape();
        if (sp) xs[static_cast<size_t>(d)] *= tp->size();
        Tensor dq = g[0].contiguous().reshape({-1, qp});
        Tensor dk, dv;
        if (m > 1) {
          Tensor dkv = all_reduce_sum(*kvg, cat_raw({g[1].contiguous(), g[2].contiguous()}, -1))
                           .reshape({-1, 2 * kp});
          dk = dkv.narrow(1, 0, kp);
          dv = dkv.narrow(1, kp, kp);
        } else {
          dk = g[1].contiguous().reshape({-1, kp});
          dv = g[2].contiguous().reshape({-1, kp});
        }
        Tensor dkv_x = add(matmul(dk, wk), matmul(dv, wv));
        if (m > 1) dkv_x = mul(dkv_x, 1.0 / static_cast<double>(m));
        Tensor dx = add(matmul(dq, wq), dkv_x).view(xs);
        Grads r(has_bias ? 7 : 4);
        r[0] = sp ? reduce_scatter_sum(*tp, dx, d, "GQAQKVColumnParallelLinear")
                  : all_reduce_sum(*tp, dx);
        if (need_w) {
          Tensor x2 = xi.reshape({-1, in_f});
          r[1] = matmul(dq.t(), x2);
          r[2] = matmul(dk.t(), x2);
          r[3] = matmul(dv.t(), x2);
        }
        if (has_bias) {
          r[4] = sum(dq, {0});
          r[5] = sum(dk, {0});
          r[6] = sum(dv, {0});
        }
        return r;
      });
}

// [..., tp*p] gathered replicated shards -> [..., kv_out]: keeps the first replica of each block.
Tensor dereplicate(const Tensor& y, int tp, int64_t m) {
  Shape lead(y.shape().begin(), y.shape().end() - 1), s = lead, f = lead;
  const int64_t p = y.size(-1) / tp;
  s.insert(s.end(), {tp / m, m, p});
  f.push_back(tp / m * p);
  return reshape(select(view(y, s), static_cast<int64_t>(s.size()) - 2, 0), f);
}

}  // namespace

GQAQKVColumnParallelLinear::GQAQKVColumnParallelLinear(int64_t in, int64_t q_out, int64_t kv_out,
                                                       const GQAQKVColumnParallelLinearOptions& o)
    : Module("GQAQKVColumnParallelLinear"),
      in_features_(in),
      q_out_(q_out),
      kv_out_(kv_out),
      kv_size_multiplier_(o.kv_size_multiplier),
      opts_(o),
      group_(resolve_group(o.group)) {
  const char* op = "GQAQKVColumnParallelLinear";
  tp_size_ = group_->size();
  const int r = group_->rank();
  NXD_CHECK(in > 0 && q_out > 0 && kv_out > 0, "[", op, "] sizes must be positive, got in=", in,
            " q_out=", q_out, " kv_out=", kv_out);
  NXD_CHECK(kv_size_multiplier_ >= 1, "[", op, "] kv_size_multiplier must be >= 1, got ",
            kv_size_multiplier_);
  NXD_CHECK(!(o.sequence_parallel_enabled && o.gather_output), "[", op,
            "] sequence_parallel_enabled requires gather_output=false");
  if (o.head_dim > 0) {
    const int64_t d = o.head_dim;
    NXD_CHECK_SHAPE(q_out % d == 0 && kv_out % d == 0, "[", op, "] output sizes q=", q_out,
                    " kv=", kv_out, " are not whole heads of head_dim ", d);
    NXD_CHECK_SHAPE((q_out / d) % tp_size_ == 0, "[", op, "] ", q_out / d,
                    " query heads are not divisible by tensor parallel size ", tp_size_);
    NXD_CHECK_SHAPE(tp_size_ % kv_size_multiplier_ == 0, "[", op, "] tensor parallel size ",
                    tp_size_, " is not divisible by kv_size_multiplier ", kv_size_multiplier_);
    NXD_CHECK_SHAPE((kv_out / d * kv_size_multiplier_) % tp_size_ == 0, "[", op, "] ", kv_out / d,
                    " key/value heads x kv_size_multiplier ", kv_size_multiplier_,
                    " are not divisible by tensor parallel size ", tp_size_,
                    " (replicate the KV heads with kv_size_multiplier = tp / kv heads)");
  }
  check_divisible(op, "query output size", q_out, tp_size_);
  NXD_CHECK_SHAPE(tp_size_ % kv_size_multiplier_ == 0, "[", op, "] tensor parallel size ", tp_size_,
                  " is not divisible by kv_size_multiplier ", kv_size_multiplier_);
  NXD_CHECK_SHAPE((kv_out * kv_size_multiplier_) % tp_size_ == 0, "[", op,
                  "] key/value output size ", kv_out, " x kv_size_multiplier ", kv_size_multiplier_,
                  " is not divisible by tensor parallel size ", tp_size_,
                  " (replicate the KV heads with kv_size_multiplier)");
  const int64_t qp = q_out / tp_size_, kp = kv_out * kv_size_multiplier_ / tp_size_;
  ParallelAttrs qa;
  qa.tensor_model_parallel = tp_size_ > 1;
  qa.partition_dim = 0;
  qa.num_partitions = tp_size_;
  ParallelAttrs ka = qa;
  ka.kv_replicas = kv_size_multiplier_;
  const int64_t block = r / kv_size_multiplier_;
  q_proj_ = register_module(
      "q_proj", std::make_shared<ProjectionShard>(in, qp, q_out, r * qp, o.bias, o, qa));
  k_proj_ = register_module(
      "k_proj", std::make_shared<ProjectionShard>(in, kp, kv_out, block * kp, o.bias, o, ka));
  v_proj_ = register_module(
      "v_proj", std::make_shared<ProjectionShard>(in, kp, kv_out, block * kp, o.bias, o, ka));
  if (kv_size_multiplier_ > 1) kv_group_ = kv_replica_group(group_, kv_size_multiplier_);
  for (const auto& p : {q_proj_, k_proj_, v_proj_})
    static_cast<ProjectionShard&>(*p).set_groups(group_, p == q_proj_ ? nullptr : kv_group_);
}

std::array<Tensor, 3> GQAQKVColumnParallelLinear::forward(const Tensor& x) const {
  NXD_CHECK_SHAPE(x.defined() && x.dim() >= 1 && x.size(-1) == in_features_,
                  "[GQAQKVColumnParallelLinear] expected input [..., ", in_features_, "], got ",
                  x.defined() ? x.desc() : "undefined");
  Tensor wq = param_or_none(*q_proj_, "weight"), bq = param_or_none(*q_proj_, "bias");
  Tensor wk = param_or_none(*k_proj_, "weight"), bk = param_or_none(*k_proj_, "bias");
  Tensor wv = param_or_none(*v_proj_, "weight"), bv = param_or_none(*v_proj_, "bias");
  Tensor q, k, v;
  // Without a graph (inference) and without SP the custom function's forward is these three
  // products (its copy-to-region is the identity): run them as plain ops, which the tracer records.
  // v, k, q: the graph order of nxd's attention projections (it fixes the order in which backward
  // sums dX's three terms, so TP 1 gives the bits it always gave).
  if (tp_size_ == 1 || (!GradMode::is_enabled() && !opts_.sequence_parallel_enabled)) {
    v = shard(v_proj_).weight_product(x, wv, bv);
    k = shard(k_proj_).weight_product(x, wk, bk);
    q = shard(q_proj_).weight_product(x, wq, bq);
  } else {
    NXD_CHECK(!shard(q_proj_).quantized(),
              "[GQAQKVColumnParallelLinear] quantized weights run without a gradient and without "
              "sequence parallelism at TP > 1");
    auto out = qkv_linear(x, {wq, wk, wv}, {bq, bk, bv}, kv_size_multiplier_,
                          opts_.sequence_parallel_enabled, opts_.sequence_dimension, group_.get(),
                          kv_group_.get());
    q = out[0], k = out[1], v = out[2];
  }
  if (const LoraAdapter* l = q_proj_->lora()) q = add(q, l->delta(x));
  if (const LoraAdapter* l = k_proj_->lora()) k = add(k, l->delta(x));
  if (const LoraAdapter* l = v_proj_->lora()) v = add(v, l->delta(x));
  if (opts_.gather_output && tp_size_ > 1) {
    q = gather_from_tensor_model_parallel_region(q, *group_);
    k = gather_from_tensor_model_parallel_region(k, *group_);
    v = gather_from_tensor_model_parallel_region(v, *group_);
    if (kv_size_multiplier_ > 1) {
      k = dereplicate(k, tp_size_, kv_size_multiplier_);
      v = dereplicate(v, tp_size_, kv_size_multiplier_);
    }
  }
  return {q, k, v};
}

}  // namespace nxd

#include "nxd/layers/parallel/qkv.h"

#include <map>
#include <utility>

#include "nxd/layers/parallel/mappings.h"
#include "nxd/runtime/context.h"

namespace nxd {

using namespace tp_detail;

namespace {

// One projection's shard: "weight" [rows, in] and optional "bias" [rows], a block of the full
// [full_rows, in] weight starting at row `row0`.
class ProjectionShard : public ParallelModule {
 public:
  ProjectionShard(int64_t in, int64_t rows, int64_t full_rows, int64_t row0, bool bias,
                  const GQAQKVColumnParallelLinearOptions& o, const ParallelAttrs& attrs)
      : ParallelModule("ColumnParallelLinear") {
    const auto& p = o.param;
    register_parameter("weight", zeros({rows, in}, p.dtype, p.device),
                       with_region(o.weight_init, {full_rows, in}, {row0, 0}));
    set_parallel_attrs("weight", attrs);
    if (bias) {
      register_parameter("bias", zeros({rows}, p.dtype, p.device),
                         with_region(o.bias_init, {full_rows}, {row0}));
      set_parallel_attrs("bias", attrs);
    }
  }
};

Tensor param_or_none(const Module& m, const char* name) {
  for (auto& [n, t] : m.named_parameters(false))
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

// K and V projections whose outputs are replicated over the KV group (NxD §2.6 backward).
std::pair<Tensor, Tensor> kv_replicated_linear(const Tensor& x, const Tensor& wk, const Tensor& bk,
                                               const Tensor& wv, const Tensor& bv, int64_t m,
                                               Communicator* kvg) {
  const bool has_bias = bk.defined();
  std::vector<Tensor> in{x, wk, wv};
  if (has_bias) in.insert(in.end(), {bk, bv});
  auto out = autograd::custom(
      "gqa_kv_replicated_linear", in,
      [has_bias](const std::vector<Tensor>& t) {
        return std::vector<Tensor>{linear(t[0], t[1], has_bias ? t[3] : Tensor()),
                                   linear(t[0], t[2], has_bias ? t[4] : Tensor())};
      },
      [xd = x.detach(), wkd = wk.detach(), wvd = wv.detach(), has_bias, m,
       kvg](const Grads& g) -> Grads {
        const int64_t p = wkd.size(0), in_f = wkd.size(1);
        Tensor dkv = cat_raw({g[0].contiguous(), g[1].contiguous()}, -1);
        dkv = all_reduce_sum(*kvg, dkv);  // the KV-replica group's summed dK | dV
        Tensor d2 = dkv.reshape({-1, 2 * p});
        Tensor dk = d2.narrow(1, 0, p), dv = d2.narrow(1, p, p);
        Tensor x2 = xd.reshape({-1, in_f});
        Grads r(has_bias ? 5 : 3);
        Tensor dx = add(matmul(dk, wkd), matmul(dv, wvd));
        r[0] = mul(dx, 1.0 / static_cast<double>(m)).view(xd.shape());
        r[1] = matmul(dk.t(), x2);
        r[2] = matmul(dv.t(), x2);
        if (has_bias) {
          r[3] = sum(dk, {0});
          r[4] = sum(dv, {0});
        }
        return r;
      });
  return {out[0], out[1]};
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
      in_(in),
      q_out_(q_out),
      kv_out_(kv_out),
      m_(o.kv_size_multiplier),
      o_(o),
      group_(resolve_group(o.group)) {
  const char* op = "GQAQKVColumnParallelLinear";
  tp_ = group_->size();
  const int r = group_->rank();
  NXD_CHECK(in > 0 && q_out > 0 && kv_out > 0, "[", op, "] sizes must be positive, got in=", in,
            " q_out=", q_out, " kv_out=", kv_out);
  NXD_CHECK(m_ >= 1, "[", op, "] kv_size_multiplier must be >= 1, got ", m_);
  NXD_CHECK(!(o.sequence_parallel_enabled && o.gather_output), "[", op,
            "] sequence_parallel_enabled requires gather_output=false");
  if (o.head_dim > 0) {
    const int64_t d = o.head_dim;
    NXD_CHECK_SHAPE(q_out % d == 0 && kv_out % d == 0, "[", op, "] output sizes q=", q_out,
                    " kv=", kv_out, " are not whole heads of head_dim ", d);
    NXD_CHECK_SHAPE((q_out / d) % tp_ == 0, "[", op, "] ", q_out / d,
                    " query heads are not divisible by tensor parallel size ", tp_);
    NXD_CHECK_SHAPE(tp_ % m_ == 0, "[", op, "] tensor parallel size ", tp_,
                    " is not divisible by kv_size_multiplier ", m_);
    NXD_CHECK_SHAPE((kv_out / d * m_) % tp_ == 0, "[", op, "] ", kv_out / d,
                    " key/value heads x kv_size_multiplier ", m_,
                    " are not divisible by tensor parallel size ", tp_,
                    " (replicate the KV heads with kv_size_multiplier = tp / kv heads)");
  }
  check_divisible(op, "query output size", q_out, tp_);
  NXD_CHECK_SHAPE(tp_ % m_ == 0, "[", op, "] tensor parallel size ", tp_,
                  " is not divisible by kv_size_multiplier ", m_);
  NXD_CHECK_SHAPE((kv_out * m_) % tp_ == 0, "[", op, "] key/value output size ", kv_out,
                  " x kv_size_multiplier ", m_, " is not divisible by tensor parallel size ", tp_,
                  " (replicate the KV heads with kv_size_multiplier)");
  const int64_t qp = q_out / tp_, kp = kv_out * m_ / tp_;
  ParallelAttrs qa;
  qa.tensor_model_parallel = tp_ > 1;
  qa.partition_dim = 0;
  qa.num_partitions = tp_;
  ParallelAttrs ka = qa;
  ka.kv_replicas = m_;
  const int64_t block = r / m_;
  q_ = register_module("q_proj",
                       std::make_shared<ProjectionShard>(in, qp, q_out, r * qp, o.bias, o, qa));
  k_ = register_module(
      "k_proj", std::make_shared<ProjectionShard>(in, kp, kv_out, block * kp, o.bias, o, ka));
  v_ = register_module(
      "v_proj", std::make_shared<ProjectionShard>(in, kp, kv_out, block * kp, o.bias, o, ka));
  if (m_ > 1) kv_group_ = kv_replica_group(group_, m_);
}

std::array<Tensor, 3> GQAQKVColumnParallelLinear::forward(const Tensor& x) const {
  NXD_CHECK_SHAPE(x.defined() && x.dim() >= 1 && x.size(-1) == in_,
                  "[GQAQKVColumnParallelLinear] expected input [..., ", in_, "], got ",
                  x.defined() ? x.desc() : "undefined");
  Tensor in = o_.sequence_parallel_enabled
                  ? gather_from_sequence_parallel_region(x, o_.sequence_dimension, true, *group_)
                  : copy_to_tensor_model_parallel_region(x, *group_);
  Tensor wq = param_or_none(*q_, "weight"), bq = param_or_none(*q_, "bias");
  Tensor wk = param_or_none(*k_, "weight"), bk = param_or_none(*k_, "bias");
  Tensor wv = param_or_none(*v_, "weight"), bv = param_or_none(*v_, "bias");
  Tensor q = linear(in, wq, bq), k, v;
  if (m_ == 1) {
    k = linear(in, wk, bk);
    v = linear(in, wv, bv);
  } else {
    std::tie(k, v) = kv_replicated_linear(in, wk, bk, wv, bv, m_, kv_group_.get());
  }
  if (o_.gather_output && tp_ > 1) {
    q = gather_from_tensor_model_parallel_region(q, *group_);
    k = gather_from_tensor_model_parallel_region(k, *group_);
    v = gather_from_tensor_model_parallel_region(v, *group_);
    if (m_ > 1) {
      k = dereplicate(k, tp_, m_);
      v = dereplicate(v, tp_, m_);
    }
  }
  return {q, k, v};
}

}  // namespace nxd

#include "nxd/layers/parallel/layers.h"

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/lora.h"
#include "nxd/layers/parallel/mappings.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

namespace tp_detail {

namespace {
struct SingleRankGroup {  // one per Context: the group of a rank built without parallel_state
  std::shared_ptr<Communicator> group;
};
}  // namespace

std::shared_ptr<Communicator> resolve_group(const std::shared_ptr<Communicator>& g) {
  if (g) return g;
  if (parallel_state::model_parallel_is_initialized())
    return parallel_state::get_tensor_model_parallel_group_ptr();
  Context& ctx = current_context();
  auto& single = ctx.ext<SingleRankGroup>();
  if (!single.group) single.group = make_self_communicator(ctx.rank());
  return single.group;
}

ParamInit with_region(ParamInit init, const Shape& full, const Shape& start) {
  init.region = init::Region{full, start};
  return init;
}

}  // namespace tp_detail

using namespace tp_detail;

namespace {

// Column-parallel linear under sequence parallelism (NxD's LinearWithAsyncCommunication with
// sequence_parallel_enabled): forward all-gathers x along the sequence dim and multiplies; only
// the local shard of x is saved, and backward re-gathers it for dW while dX is reduce-scattered.
Tensor sp_column_linear(const Tensor& x, const Tensor& w, const Tensor& b, int64_t seq_dim,
                        Communicator* g) {
  const bool has_bias = b.defined();
  const int64_t d = wrap_dim(seq_dim, x.dim(), "ColumnParallelLinear");
  std::vector<Tensor> in{x, w};
  if (has_bias) in.push_back(b);
  return autograd::custom(
      "column_parallel_linear_sp", in,
      [g, d, has_bias](const std::vector<Tensor>& t) {
        return std::vector<Tensor>{
            linear(tp_detail::all_gather(*g, t[0], d), t[1], has_bias ? t[2] : Tensor())};
      },
      [xd = x.detach(), wd = w.detach(), g, d, has_bias,
       need_w = w.requires_grad()](const Grads& gr) -> Grads {
        const int64_t per = wd.size(0), in_f = wd.size(1);
        // re-gathered, not saved; a frozen weight (LoRA's base) gets no gradient and needs none
        Tensor x_full = need_w ? tp_detail::all_gather(*g, xd, d) : Tensor();
        Shape xs = xd.shape();
        xs[static_cast<size_t>(d)] *= g->size();
        Tensor dy = gr[0].contiguous();
        Tensor dy2 = dy.reshape({-1, per});
        Tensor dx_full = matmul(dy2, wd);
        Grads r(has_bias ? 3 : 2);
        r[0] = reduce_scatter_sum(*g, dx_full.view(xs), d, "ColumnParallelLinear");
        if (need_w) r[1] = matmul(dy2.t(), x_full.reshape({-1, in_f}));
        if (has_bias) r[2] = sum(dy2, {0});
        return r;
      })[0];
}

}  // namespace

ParallelLinearBase::ParallelLinearBase(const char* type, int64_t in, int64_t out,
                                       const std::shared_ptr<Communicator>& group)
    : ParallelModule(type), in_(in), out_(out), group_(resolve_group(group)) {
  tp_size_ = group_->size();
  NXD_CHECK(in > 0 && out > 0, "[", type, "] sizes must be positive, got in=", in, " out=", out);
}

// ---------------------------------------------------------------- ColumnParallelLinear

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out,
                                           const ColumnParallelLinearOptions& o)
    : ParallelLinearBase("ColumnParallelLinear", in, out, o.group), stride_(o.stride), opts_(o) {
  const char* op = "ColumnParallelLinear";
  const int r = group_->rank();
  NXD_CHECK(stride_ >= 1, "[", op, "] stride must be >= 1, got ", stride_);
  check_divisible(op, "output size", out, tp_size_);
  NXD_CHECK_SHAPE(out % (stride_ * tp_size_) == 0, "[", op, "] output size ", out,
                  " is not divisible by stride ", stride_, " x tensor parallel size ", tp_size_);
  NXD_CHECK(!(o.sequence_parallel_enabled && o.gather_output), "[", op,
            "] sequence_parallel_enabled requires gather_output=false");
  const auto& p = o.param;
  const int64_t per = out / tp_size_;
  ParallelAttrs wa;
  wa.tensor_model_parallel = tp_size_ > 1;
  wa.partition_dim = 0;
  wa.partition_stride = stride_;
  wa.num_partitions = tp_size_;
  const bool shard_bias = o.bias && !o.gather_output;
  const ParamInit w_init = o.weight_init.for_fan_in(in), b_init = o.bias_init.for_fan_in(in);
  if (stride_ == 1 || tp_size_ == 1) {
    weight_ = register_parameter("weight", zeros({per, in}, p.dtype, p.device),
                                 with_region(w_init, {out, in}, {r * per, 0}));
    if (o.bias)
      bias_ = register_parameter("bias", zeros({shard_bias ? per : out}, p.dtype, p.device),
                                 shard_bias ? with_region(b_init, {out}, {r * per}) : b_init);
  } else {
    const int64_t c = per / stride_;
    weight_ = register_parameter("weight", zeros({stride_, c, in}, p.dtype, p.device),
                                 with_region(w_init, {stride_, tp_size_ * c, in}, {0, r * c, 0}));
    if (o.bias) {
      if (shard_bias)
        bias_ = register_parameter("bias", zeros({stride_, c}, p.dtype, p.device),
                                   with_region(b_init, {stride_, tp_size_ * c}, {0, r * c}));
      else
        bias_ = register_parameter("bias", zeros({out}, p.dtype, p.device), b_init);
    }
  }
  set_parallel_attrs("weight", wa);
  if (shard_bias) set_parallel_attrs("bias", wa);
}

Tensor ColumnParallelLinear::run(const Tensor& x, BiasAdd bias) const {
  const bool add_bias = bias == BiasAdd::add;
  NXD_CHECK_SHAPE(x.defined() && x.dim() >= 1 && x.size(-1) == in_,
                  "[ColumnParallelLinear] expected input [..., ", in_, "], got ",
                  x.defined() ? x.desc() : "undefined");
  if (tp_size_ == 1) {  // the plain Linear
    Tensor y = weight_product(x, weight_, add_bias ? bias_ : Tensor());
    return lora() ? add(y, lora()->delta(x)) : y;
  }
  const int64_t per = out_ / tp_size_;
  Tensor w = weight_.dim() == 3 ? view(weight_, {per, in_}) : weight_;
  const bool shard_bias = bias_.defined() && !opts_.gather_output;
  Tensor b_local;
  if (shard_bias && add_bias) b_local = bias_.dim() == 2 ? view(bias_, {per}) : bias_;
  NXD_CHECK(!opts_.sequence_parallel_enabled || !quantized(),
            "[ColumnParallelLinear] a quantized weight runs without sequence parallelism");
  Tensor y = (opts_.sequence_parallel_enabled && tp_size_ > 1)
                 ? sp_column_linear(x, w, b_local, opts_.sequence_dimension, group_.get())
                 : weight_product(copy_to_tensor_model_parallel_region(x, *group_), w, b_local);
  if (lora()) y = add(y, lora()->delta(x));
  if (opts_.gather_output) {
    y = gather_from_tensor_model_parallel_region(y, *group_);
    if (stride_ > 1 && tp_size_ > 1) {  // [.., tp, stride, c] -> [.., stride, tp, c]
      Shape lead(y.shape().begin(), y.shape().end() - 1), s5 = lead, sf = lead;
      s5.insert(s5.end(), {int64_t(tp_size_), stride_, per / stride_});
      sf.push_back(out_);
      const int64_t nd = static_cast<int64_t>(s5.size());
      y = reshape(transpose(view(y, s5), nd - 3, nd - 2), sf);
    }
    if (bias_.defined() && add_bias) y = y + bias_;
  }
  return y;
}

Tensor ColumnParallelLinear::forward(const Tensor& x) const {
  return run(x, opts_.skip_bias_add ? BiasAdd::leave_out : BiasAdd::add);
}

std::pair<Tensor, Tensor> ColumnParallelLinear::forward_and_bias(const Tensor& x) const {
  if (!opts_.skip_bias_add) return {run(x, BiasAdd::add), Tensor()};
  Tensor b = bias_;
  if (b.defined() && b.dim() == 2) b = view(b, {out_ / tp_size_});
  return {run(x, BiasAdd::leave_out), b};
}

// ---------------------------------------------------------------- RowParallelLinear

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, const RowParallelLinearOptions& o)
    : ParallelLinearBase("RowParallelLinear", in, out, o.group), opts_(o) {
  const char* op = "RowParallelLinear";
  const int r = group_->rank();
  check_divisible(op, "input size", in, tp_size_);
  NXD_CHECK(!o.sequence_parallel_enabled || o.input_is_parallel, "[", op,
            "] sequence_parallel_enabled requires input_is_parallel=true");
  const auto& p = o.param;
  const int64_t per = in / tp_size_;
  weight_ = register_parameter("weight", zeros({out, per}, p.dtype, p.device),
                               with_region(o.weight_init.for_fan_in(in), {out, in}, {0, r * per}));
  if (o.bias)
    bias_ = register_parameter("bias", zeros({out}, p.dtype, p.device), o.bias_init.for_fan_in(in));
  ParallelAttrs wa;
  wa.tensor_model_parallel = tp_size_ > 1;
  wa.partition_dim = 1;
  wa.num_partitions = tp_size_;
  set_parallel_attrs("weight", wa);
  if (o.bias && o.sequence_parallel_enabled) {
    ParallelAttrs ba;
    ba.sequence_parallel_enabled = true;
    set_parallel_attrs("bias", ba);
  }
}

Tensor RowParallelLinear::run(const Tensor& x) const {
  const int64_t want = opts_.input_is_parallel ? in_ / tp_size_ : in_;
  NXD_CHECK_SHAPE(x.defined() && x.dim() >= 1 && x.size(-1) == want,
                  "[RowParallelLinear] expected input [..., ", want, "] (in=", in_,
                  ", tp=", tp_size_, opts_.input_is_parallel ? ", input_is_parallel" : "",
                  "), got ", x.defined() ? x.desc() : "undefined");
  Tensor in = opts_.input_is_parallel ? x : scatter_to_tensor_model_parallel_region(x, *group_);
  Tensor y = weight_product(in, weight_, Tensor());
  y = opts_.sequence_parallel_enabled
          ? reduce_scatter_to_sequence_parallel_region(y, opts_.sequence_dimension, *group_)
          : reduce_from_tensor_model_parallel_region(y, *group_);
  return lora() ? add(y, lora()->delta(x)) : y;
}

Tensor RowParallelLinear::forward(const Tensor& x) const {
  if (tp_size_ == 1 && !opts_.skip_bias_add) {  // the plain Linear (its bias added by the GEMM)
    NXD_CHECK_SHAPE(x.defined() && x.dim() >= 1 && x.size(-1) == in_,
                    "[RowParallelLinear] expected input [..., ", in_, "], got ",
                    x.defined() ? x.desc() : "undefined");
    Tensor y = weight_product(x, weight_, bias_);
    return lora() ? add(y, lora()->delta(x)) : y;
  }
  Tensor y = run(x);
  return (bias_.defined() && !opts_.skip_bias_add) ? y + bias_ : y;
}

std::pair<Tensor, Tensor> RowParallelLinear::forward_and_bias(const Tensor& x) const {
  if (!opts_.skip_bias_add) return {forward(x), Tensor()};
  return {run(x), bias_};
}

LoraTarget ParallelLinearBase::lora_target_of(bool sequence_parallel, int64_t seq_dim) const {
  LoraTarget t;
  t.in = in_;
  t.out = out_;
  t.sequence_parallel = sequence_parallel && tp_size_ > 1;
  t.sequence_dimension = seq_dim;
  t.group = group_;
  t.param = {weight_.dtype(), weight_.device()};
  return t;
}

bool ColumnParallelLinear::lora_target(LoraTarget& t) const {
  t = lora_target_of(opts_.sequence_parallel_enabled, opts_.sequence_dimension);
  t.style = LoraTarget::Style::column;
  t.local_out = out_ / tp_size_;
  t.out0 = group_->rank() * t.local_out;
  t.stride = stride_;
  return true;
}

bool RowParallelLinear::lora_target(LoraTarget& t) const {
  t = lora_target_of(opts_.sequence_parallel_enabled, opts_.sequence_dimension);
  t.style = LoraTarget::Style::row;
  t.local_in = in_ / tp_size_;
  t.in0 = group_->rank() * t.local_in;
  t.input_is_parallel = opts_.input_is_parallel;
  return true;
}

// ---------------------------------------------------------------- ParallelEmbedding

ParallelEmbedding::ParallelEmbedding(int64_t num, int64_t dim, const ParallelEmbeddingOptions& o)
    : ParallelModule("ParallelEmbedding"),
      num_embeddings_(num),
      dim_(dim),
      opts_(o),
      group_(resolve_group(o.group)) {
  const char* op = "ParallelEmbedding";
  tp_size_ = group_->size();
  const int r = group_->rank();
  NXD_CHECK(num > 0 && dim > 0, "[", op, "] sizes must be positive, got num=", num, " dim=", dim);
  const auto& p = o.param;
  ParallelAttrs wa;
  wa.tensor_model_parallel = tp_size_ > 1;
  wa.num_partitions = tp_size_;
  if (o.shard_across_embedding) {
    check_divisible(op, "embedding dim", dim, tp_size_);
    const int64_t per = dim / tp_size_;
    weight_ = register_parameter("weight", zeros({num, per}, p.dtype, p.device),
                                 with_region(o.weight_init, {num, dim}, {0, r * per}));
    wa.partition_dim = 1;
  } else {
    check_divisible(op, "vocabulary size", num, tp_size_);
    const int64_t per = num / tp_size_;
    weight_ = register_parameter("weight", zeros({per, dim}, p.dtype, p.device),
                                 with_region(o.weight_init, {num, dim}, {r * per, 0}));
    wa.partition_dim = 0;
  }
  set_parallel_attrs("weight", wa);
}

Tensor vocab_parallel_lookup(const Tensor& ids, const Tensor& weight, int64_t num, int64_t start) {
  const char* op = "ParallelEmbedding";
  OpScope scope_("vocab_parallel_lookup");
  // Out-of-range ids read local row 0 and are masked to zero.
  const int64_t per = weight.size(0), num_embeddings_ = num;
  const Tensor& weight_ = weight;
  Shape mshape = ids.shape();
  mshape.push_back(1);
  const bool meta = ids.is_meta() || weight_.is_meta();  // shapes only (the planner)
  Tensor local = meta ? ids : empty(ids.shape(), DType::i64);
  Tensor mask = empty(mshape, weight_.dtype(), meta ? Device::meta : Device::host);
  if (!meta) {
    std::vector<double> v = ids.detach().to_vector();
    auto* lp = local.data<int64_t>();
    std::vector<double> m(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const int64_t id = static_cast<int64_t>(v[i]);
      NXD_CHECK(id >= 0 && id < num_embeddings_, "[", op, "] id ", id, " out of range [0, ",
                num_embeddings_, ")");
      const bool mine = id >= start && id < start + per;
      lp[i] = mine ? id - start : 0;
      m[i] = mine ? 1.0 : 0.0;
    }
    mask.copy_(from_doubles(m, mshape, DType::f64));
  }
  return scope_.out(mul(embedding(local, weight_), mask), [&] {
    return OpCall{{ids, weight}, OpAttrs().set("num", num).set("start", start)};
  });
}

Tensor ParallelEmbedding::forward(const Tensor& ids) const {
  const char* op = "ParallelEmbedding";
  NXD_CHECK(ids.defined() && (ids.dtype() == DType::i32 || ids.dtype() == DType::i64), "[", op,
            "] ids must be i32 or i64, got ", ids.defined() ? ids.desc() : "undefined");
  if (tp_size_ == 1) return embedding(ids, weight_);
  if (opts_.shard_across_embedding) {
    Tensor y = gather_from_tensor_model_parallel_region(embedding(ids, weight_), *group_);
    return opts_.sequence_parallel_enabled
               ? scatter_to_sequence_parallel_region(y, opts_.sequence_dimension, *group_)
               : y;
  }
  Tensor y = vocab_parallel_lookup(ids, weight_, num_embeddings_,
                                   group_->rank() * (num_embeddings_ / tp_size_));
  return opts_.sequence_parallel_enabled
             ? reduce_scatter_to_sequence_parallel_region(y, opts_.sequence_dimension, *group_)
             : reduce_from_tensor_model_parallel_region(y, *group_);
}

}  // namespace nxd

// Zero1Optimizer (optim/zero1.h): construction (the parameters' order, the gradient buckets, each
// parameter's segment and this rank's shard of each bucket, the flat parameter buffers, the state)
// and its accessors. The step: zero1_step.cpp; the norm: zero1_norm.cpp; checkpoint state:
// zero1_state.cpp; stage three's units: zero1_stage3.cpp; the experts' optimizer:
// zero1_experts.cpp.
#include <map>
#include <string>

#include "nxd/collectives/parallel_state.h"
#include "nxd/optim/zero1_impl.h"

namespace nxd::optim {

namespace {

using Impl = Zero1Optimizer::Impl;
using GroupOf = std::map<const TensorImpl*, int>;
using zero1_detail::Segment;
using zero1_detail::Shard;

ElementwiseRule rule_of(const Zero1Options& o) {
  if (o.rule) return *o.rule;
  const auto& a = o.adamw;
  NXD_CHECK(a.beta1 >= 0 && a.beta1 < 1 && a.beta2 >= 0 && a.beta2 < 1 && a.eps >= 0,
            "[Zero1Optimizer] need beta1, beta2 in [0, 1) and eps >= 0, got ", a.beta1, ", ",
            a.beta2, ", ", a.eps);
  return adamw_rule(a);
}

// The parameters of `mine` in the buckets' order (the groups' order, or registration_order's,
// which loses the experts' parameters when `experts`); fills each one's group in `group_of`.
std::vector<NamedParam> bucket_order(const std::vector<ParamGroup>& mine, Zero1Options& o,
                                     bool experts, GroupOf& group_of) {
  std::vector<NamedParam> order;
  for (size_t g = 0; g < mine.size(); ++g)
    for (const NamedParam& p : mine[g].params) {
      NXD_CHECK(p.param.dtype() == DType::f32 || p.param.dtype() == DType::bf16,
                "[Zero1Optimizer] parameter '", p.name, "' is ", p.param.desc(),
                ": ZeRO-1 shards f32 and bf16 parameters");
      group_of[p.param.impl()] = static_cast<int>(g);
      order.push_back(p);
    }
  if (experts)
    std::erase_if(o.registration_order,
                  [&](const NamedParam& p) { return !group_of.count(p.param.impl()); });
  if (!o.registration_order.empty()) {
    NXD_CHECK(o.registration_order.size() == order.size(),
              "[Zero1Optimizer] registration_order "
              "lists ",
              o.registration_order.size(), " parameters, the groups ", order.size());
    for (const NamedParam& p : o.registration_order)
      NXD_CHECK(group_of.count(p.param.impl()), "[Zero1Optimizer] registration_order's parameter '",
                p.name, "' is in no parameter group");
    order = o.registration_order;
  }
  return order;
}

// I.shards (this rank's block of each bucket) and I.segs (each parameter's place and norm weight)
// from the GradSync's buckets.
void lay_out(Impl& I, const GroupOf& group_of) {
  const GradSync& sync = *I.sync;
  std::map<std::string, const NormParam*> attrs;
  for (const auto& np : I.opts.norm_params) attrs[np.name] = &np;
  const auto& tp = I.opts.norm_groups.tp;
  const int tp_size = tp ? tp->size() : 1, tp_rank = tp ? tp->rank() : 0;
  const int nb = sync.num_buckets();
  I.shards.resize(static_cast<size_t>(nb));
  for (int b = 0; b < nb; ++b) {
    Shard& sh = I.shards[static_cast<size_t>(b)];
    sh.size = sync.shard_numel(b);
    sh.begin = I.dp->rank() * sh.size;
    sh.flat = I.total;
    I.total += sh.size;
  }
  for (size_t i = 0; i < sync.params().size(); ++i) {
    const NamedParam& p = sync.params()[i];
    Segment s{p, sync.bucket_of(static_cast<int>(i)), sync.offset_in_bucket(static_cast<int>(i)),
              p.param.numel(), group_of.at(p.param.impl())};
    if (auto it = attrs.find(p.name); it != attrs.end()) {
      const NormParam& n = *it->second;
      const bool sharded = n.attrs.tensor_model_parallel && tp_size > 1;
      s.norm_weight = n.shared || (!sharded && tp_rank != 0)
                          ? 0.0
                          : 1.0 / static_cast<double>(sharded ? n.attrs.kv_replicas : 1);
    }
    Shard& sh = I.shards[static_cast<size_t>(s.bucket)];
    sh.param_dtype = p.param.dtype();  // a bucket holds one parameter dtype
    sh.segs.push_back(static_cast<int>(i));
    I.segs.push_back(std::move(s));
  }
}

}  // namespace

Zero1Optimizer::Zero1Optimizer(std::vector<ParamGroup> groups, Zero1Options opts)
    : Optimizer(std::move(groups), opts.rule ? opts.rule->kind : "AdamW"),
      impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.rule = rule_of(opts);
  I.opts = std::move(opts);
  // sharded by an earlier ZeRO-3 optimizer: whole again (before the experts' optimizer below sets
  // the units of the experts nested in these)
  remove_param_units(I.opts.units);
  remove_param_units(I.opts.lookup_units);
  remove_param_units(I.opts.roots);
  NXD_CHECK(
      I.rule.update != nullptr && I.rule.state.size() <= static_cast<size_t>(kMaxElementwiseState),
      "[Zero1Optimizer] ", kind_, "'s elementwise rule needs an update and at most ",
      kMaxElementwiseState, " state tensors, got ", I.rule.state.size());
  I.dp = I.opts.dp_group ? I.opts.dp_group
         : parallel_state::model_parallel_is_initialized()
             ? parallel_state::get_data_context_parallel_group_ptr()  // DP x CP (DP at CP 1)
             : make_self_communicator();
  // the parameters' groups (without the experts'), and the buckets' order
  const std::vector<ParamGroup> mine =
      I.opts.expert_params.empty() ? groups_ : split_experts(groups_, I.opts);
  GroupOf group_of;
  const std::vector<NamedParam> order = bucket_order(mine, I.opts, experts_ != nullptr, group_of);
  NXD_CHECK(I.opts.stage != ZeroStage::none, "[Zero1Optimizer] stage must be 1, 2 or 3, got ",
            zero_stage_name(I.opts.stage));
  const bool three = I.opts.stage == ZeroStage::three;
  NXD_CHECK(I.opts.expert_units.empty() || !I.opts.expert_params.empty(),
            "[Zero1Optimizer] expert_units without expert_params");
  const UnitModules modules = I.unit_modules();
  NXD_CHECK(three || (modules.empty() && I.opts.expert_units.empty()),
            "[Zero1Optimizer] units, expert units, lookup units and roots are for stage 3, got "
            "stage ",
            zero_stage_name(I.opts.stage));
  const std::vector<int> unit_of = three ? modules.unit_of(order) : std::vector<int>();
  GradSyncOptions go;
  go.storage = I.opts.stage == ZeroStage::one ? GradStorage::buckets : GradStorage::shard_only;
  go.units = unit_of;
  go.unit_launch = I.opts.unit_launch;
  go.first_root_unit = three ? modules.first_root_unit() : 0;
  go.bucket_bytes = I.opts.bucket_bytes;
  go.mode = I.opts.mode;
  go.group = I.dp;
  go.reduction = DpReduction::reduce_scatter;
  go.fp32_grad_acc = I.opts.fp32_grad_acc;
  I.sync = std::make_unique<GradSync>(order, go);
  if (experts_) I.sync->link_sync(experts_->grad_sync());  // no_sync() covers the experts too
  lay_out(I, group_of);
  I.flatten_params();
  if (three) I.build_units(unit_of);
  {
    const HostMemoryScope scope(I.state_memory());
    for (size_t k = 0; k < I.rule.state.size(); ++k)
      I.state.push_back(zeros({I.total}, DType::f32, I.state_device()));
  }
  Zero1Optimizer::set_precision(I.opts.adamw.precision);
}

Zero1Optimizer::~Zero1Optimizer() = default;

void Zero1Optimizer::set_precision(const PrecisionOptions& p) {
  NXD_CHECK(steps_ == 0, "[Zero1Optimizer] set_precision() after ", steps_, " step(s)");
  precision_ = p;  // the masters live in the shards, not in state_tensors()
  impl_->opts.adamw.precision = p;
  impl_->init_masters(p);
  if (experts_) experts_->set_precision(p);
}

ZeroStage Zero1Optimizer::stage() const {
  return impl_->opts.stage;
}
int Zero1Optimizer::dp_size() const {
  return impl_->dp->size();
}
int64_t Zero1Optimizer::shard_elements() const {
  return impl_->total + (experts_ ? experts_->shard_elements() : 0);
}
int64_t Zero1Optimizer::state_bytes() const {
  const Impl& I = *impl_;
  int64_t n = I.master.defined() ? I.master.nbytes() : 0;
  for (const Tensor& t : I.state) n += t.nbytes();
  return n + (experts_ ? experts_->state_bytes() : 0);
}
GradSync& Zero1Optimizer::grad_sync() {
  return *impl_->sync;
}
double Zero1Optimizer::offload_wait_seconds() const {
  return impl_->offload_waited + (experts_ ? experts_->offload_wait_seconds() : 0.0);
}

const AdamWOptions& Zero1Optimizer::options() const {
  return impl_->opts.adamw;
}

std::optional<ElementwiseRule> Zero1Optimizer::elementwise_rule() const {
  return impl_->rule;
}

std::vector<std::pair<std::string, double>> Zero1Optimizer::hyperparameters() const {
  return impl_->rule.hyperparameters;
}

}  // namespace nxd::optim

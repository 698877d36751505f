#include "nxd/optim/zero1.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "nxd/collectives/parallel_state.h"
#include "nxd/optim/items.h"
#include "nxd/optim/meta_update.h"
#include "nxd/optim/offload.h"
#include "nxd/optim/zero3_unit.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/host_memory.h"

namespace nxd::optim {

namespace {

// One parameter: its place in the gradient buckets and what the norm and the update need of it.
struct Segment {
  NamedParam p;
  int bucket = 0;
  int64_t offset = 0, size = 0;  // elements in the bucket
  int group = 0;
  double norm_weight = 1.0;  // 0: not counted on this rank (TP duplicate, shared)
  int64_t step = 0;
};

// This rank's shard of one bucket: bucket elements [begin, begin + size), at `flat` in the rank's
// flat state (the rule's state tensors, masters).
struct Shard {
  int64_t begin = 0, size = 0, flat = 0;
  DType param_dtype = DType::f32;
  std::vector<int> segs;  // segments of the bucket
};

}  // namespace

struct Zero1Optimizer::Impl {
  Zero1Options opts;
  std::shared_ptr<Communicator> dp;
  std::unique_ptr<GradSync> sync;
  std::vector<Segment> segs;  // in the GradSync's parameter order
  std::vector<Shard> shards;  // per bucket
  int64_t total = 0;          // sum of the shards
  ElementwiseRule rule;       // the update (AdamW's unless Zero1Options::rule)
  std::vector<Tensor> state;  // per rule.state name: [total] f32
  Tensor master;              // [total] f32 with master weights (bf16 buckets' parts)
  std::vector<Tensor> grad;   // per bucket, after reduce_gradients(): the f32 averaged shard
  // Per bucket: the parameters' flat buffer [S * n], laid out as the gradient bucket (padding
  // included); every parameter of the bucket is a view of it, so the updated shards are
  // all-gathered in place with no full-size temporary.
  std::vector<Tensor> pbuf;
  bool reduced = false;
  // Stage three, per bucket: the rank's persistent block of a unit's bucket (undefined for the
  // buckets of no unit, whose pbuf stays full); the units (layers/param_unit.h).
  std::vector<Tensor> pshard;
  std::vector<std::shared_ptr<ShardedUnit>> units;
  bool meta = false;          // the parameters are meta tensors (nxd-plan): shapes and charges only
  double offload_waited = 0;  // seconds the last step() waited for offload's round trips

  bool sharded(size_t b) const { return b < pshard.size() && pshard[b].defined(); }
  // This rank's block of bucket b's parameters.
  Tensor param_shard(size_t b) const {
    return sharded(b) ? pshard[b] : pbuf[b].narrow(0, shards[b].begin, shards[b].size);
  }
  // Moves every parameter into its bucket's flat buffer (one bucket at a time: the old storage
  // of a parameter is freed as it moves). Views taken of a parameter before keep the old memory.
  void flatten_params() {
    NoGradGuard ng;
    pbuf.clear();
    const int n = dp->size();
    for (const Shard& sh : shards) {
      const bool meta = !sh.segs.empty() && segs[static_cast<size_t>(sh.segs[0])].p.param.is_meta();
      pbuf.push_back(zeros({sh.size * n}, sh.param_dtype, meta ? Device::meta : Device::host));
      this->meta = this->meta || meta;
      for (int i : sh.segs) {
        const Segment& s = segs[static_cast<size_t>(i)];
        NXD_CHECK(s.p.param.is_meta() == meta, "[Zero1Optimizer] parameter '", s.p.name,
                  "' is on another device than the rest of its bucket");
        bind(s);
      }
    }
  }
  // Whether segment s's parameter is (still) the view of its bucket's buffer.
  bool bound(const Segment& s) const {
    const TensorImpl& impl = *s.p.param.impl();
    const Tensor& buf = pbuf[static_cast<size_t>(s.bucket)];
    return impl.storage == buf.impl()->storage && impl.offset == buf.offset() + s.offset &&
           s.p.param.is_contiguous();
  }
  // Copies the parameter's values into its slice of the bucket's buffer and makes the parameter
  // a view of that slice (every handle on the parameter's TensorImpl sees it).
  void bind(const Segment& s) {
    const Tensor& p = s.p.param;
    NXD_CHECK(p.is_contiguous(), "[Zero1Optimizer] parameter '", s.p.name, "' is not contiguous");
    Tensor dst = pbuf[static_cast<size_t>(s.bucket)].narrow(0, s.offset, s.size);
    if (!p.is_meta()) dst.copy_(p.detach().view({s.size}));
    TensorImpl& impl = *p.impl();
    impl.storage = dst.impl()->storage;
    impl.offset = dst.offset();
    impl.strides = contiguous_strides(impl.shape);
  }
  // The part of segment s inside its bucket's shard: [lo, hi) in bucket coordinates.
  std::pair<int64_t, int64_t> overlap(const Segment& s) const {
    const Shard& sh = shards[static_cast<size_t>(s.bucket)];
    return {std::max(s.offset, sh.begin), std::min(s.offset + s.size, sh.begin + sh.size)};
  }
  bool has_master(const Shard& sh, const PrecisionOptions& p) const {
    return p.master_weights && sh.param_dtype == DType::bf16;
  }
  // Copies the shard's parameter values (as f32) into dst [sh.size]; padding stays as it is.
  void read_params(const Shard& sh, float* dst) const {
    const char* mine = static_cast<const char*>(param_shard(&sh - shards.data()).raw_data());
    for (int i : sh.segs) {
      const Segment& s = segs[static_cast<size_t>(i)];
      const auto [lo, hi] = overlap(s);
      if (hi > lo)
        convert(dst + (lo - sh.begin), DType::f32,
                mine + (lo - sh.begin) * dtype_size(sh.param_dtype), sh.param_dtype, hi - lo);
    }
  }
  void build_units(const std::vector<int>& unit_of);
  // Where the state's allocations go: host memory under optimizer offload.
  HostPlacement state_memory() const {
    return opts.placement == StatePlacement::host ? HostPlacement::on : HostPlacement::off;
  }
  Device state_device() const { return meta ? Device::meta : Device::host; }
  // The update's elementwise pass over `numel` elements of a shard on the device's clock (with
  // optimizer offload the host runs it: nothing on the device), real and meta alike.
  void charge(const Shard& sh, int64_t numel) const {
    if (opts.placement == StatePlacement::host) return;
    detail::charge_update(rule.kind, {.numel = numel,
                                      .state_tensors = static_cast<int>(rule.state.size()),
                                      .flops_per_element = rule.cost,
                                      .param_dtype = sh.param_dtype});
  }
  // Optimizer offload: this step's round trips of the shards, from now (optim/offload.h).
  OffloadSchedule offload_schedule(const PrecisionOptions& p) const {
    if (opts.placement != StatePlacement::host) return {};
    std::vector<sim::OffloadBucket> trips;
    for (size_t b = 0; b < shards.size(); ++b)
      trips.push_back(offload_bucket(shards[b].size, sync->bucket_dtype(static_cast<int>(b)),
                                     shards[b].param_dtype, static_cast<int>(rule.state.size()),
                                     has_master(shards[b], p)));
    return OffloadSchedule(trips);
  }
  void init_masters(const PrecisionOptions& p) {
    const HostMemoryScope scope(state_memory());
    master = Tensor();
    bool any = false;
    for (const Shard& sh : shards) any = any || has_master(sh, p);
    if (!any) return;
    master = zeros({total}, DType::f32, state_device());
    if (meta) return;
    for (const Shard& sh : shards)
      if (has_master(sh, p)) read_params(sh, master.data<float>() + sh.flat);
  }
};

// Stage three: each unit's buckets get a persistent shard and a ShardedUnit on the unit's module;
// their full buffers are released.
void Zero1Optimizer::Impl::build_units(const std::vector<int>& unit_of) {
  NoGradGuard ng;
  pshard.assign(shards.size(), Tensor());
  for (size_t u = 0; u < opts.units.size(); ++u)
    units.push_back(std::make_shared<ShardedUnit>(dp, opts.reshard_after_forward));
  for (size_t b = 0; b < shards.size(); ++b) {
    if (shards[b].segs.empty()) continue;
    const int u = unit_of[static_cast<size_t>(shards[b].segs[0])];
    for (int i : shards[b].segs)
      NXD_CHECK(unit_of[static_cast<size_t>(i)] == u, "[Zero1Optimizer] bucket ", b,
                " mixes units");  // GradSyncOptions::units
    if (u == 0) continue;
    pshard[b] = pbuf[b].narrow(0, shards[b].begin, shards[b].size).clone();
    units[static_cast<size_t>(u - 1)]->add_bucket(pbuf[b], pshard[b]);
    pbuf[b].storage()->release_data();  // now: the model's full size is never exceeded
  }
  for (size_t u = 0; u < units.size(); ++u) {
    units[u]->set_neighbours(u > 0 ? units[u - 1] : nullptr,
                             u + 1 < units.size() ? units[u + 1] : nullptr);
    units[u]->release(UnitPass::forward);
    opts.units[u]->set_param_unit(units[u]);
  }
}

namespace {
ElementwiseRule rule_of(const Zero1Options& o) {
  if (o.rule) return *o.rule;
  const auto& a = o.adamw;
  NXD_CHECK(a.beta1 >= 0 && a.beta1 < 1 && a.beta2 >= 0 && a.beta2 < 1 && a.eps >= 0,
            "[Zero1Optimizer] need beta1, beta2 in [0, 1) and eps >= 0, got ", a.beta1, ", ",
            a.beta2, ", ", a.eps);
  return adamw_rule(a);
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
  std::map<const TensorImpl*, int> group_of;
  std::vector<NamedParam> order;
  for (size_t g = 0; g < mine.size(); ++g)
    for (const NamedParam& p : mine[g].params) {
      NXD_CHECK(p.param.dtype() == DType::f32 || p.param.dtype() == DType::bf16,
                "[Zero1Optimizer] parameter '", p.name, "' is ", p.param.desc(),
                ": ZeRO-1 shards f32 and bf16 parameters");
      group_of[p.param.impl()] = static_cast<int>(g);
      order.push_back(p);
    }
  if (experts_)
    std::erase_if(I.opts.registration_order,
                  [&](const NamedParam& p) { return !group_of.count(p.param.impl()); });
  if (!I.opts.registration_order.empty()) {
    NXD_CHECK(I.opts.registration_order.size() == order.size(),
              "[Zero1Optimizer] registration_order "
              "lists ",
              I.opts.registration_order.size(), " parameters, the groups ", order.size());
    for (const NamedParam& p : I.opts.registration_order)
      NXD_CHECK(group_of.count(p.param.impl()), "[Zero1Optimizer] registration_order's parameter '",
                p.name, "' is in no parameter group");
    order = I.opts.registration_order;
  }
  NXD_CHECK(I.opts.stage != ZeroStage::none, "[Zero1Optimizer] stage must be 1, 2 or 3, got ",
            zero_stage_name(I.opts.stage));
  const bool three = I.opts.stage == ZeroStage::three;
  NXD_CHECK(I.opts.expert_units.empty() || !I.opts.expert_params.empty(),
            "[Zero1Optimizer] expert_units without expert_params");
  NXD_CHECK(three || (I.opts.units.empty() && I.opts.expert_units.empty()),
            "[Zero1Optimizer] units are for stage 3, got stage ", zero_stage_name(I.opts.stage));
  // stage three: each parameter's unit (1 + its index in opts.units; 0: none)
  std::vector<int> unit_of;
  if (three) {
    std::map<const TensorImpl*, int> of;
    for (size_t u = 0; u < I.opts.units.size(); ++u)
      for (const Tensor& t : I.opts.units[u]->parameters()) of.emplace(t.impl(), int(u) + 1);
    for (const NamedParam& p : order)
      unit_of.push_back(of.count(p.param.impl()) ? of.at(p.param.impl()) : 0);
  }
  GradSyncOptions go;
  go.storage = I.opts.stage == ZeroStage::one ? GradStorage::buckets : GradStorage::shard_only;
  go.units = unit_of;
  go.bucket_bytes = I.opts.bucket_bytes;
  go.mode = I.opts.mode;
  go.group = I.dp;
  go.reduction = DpReduction::reduce_scatter;
  go.fp32_grad_acc = I.opts.fp32_grad_acc;
  I.sync = std::make_unique<GradSync>(order, go);
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

void Zero1Optimizer::reduce_gradients() {
  Impl& I = *impl_;
  NoGradGuard ng;
  // a unit whose backward did not release it (its input needed no gradient) goes now: its full
  // buffers would go stale with the update
  for (auto& u : I.units) u->release(UnitPass::backward);
  I.sync->finish();
  I.grad.clear();
  for (int b = 0; b < I.sync->num_buckets(); ++b) {
    Tensor g = I.sync->bucket_shard(b);
    I.grad.push_back(g.dtype() == DType::f32 ? g : g.to(DType::f32));
  }
  I.reduced = true;
  if (experts_) experts_->reduce_gradients();
}

double Zero1Optimizer::grad_sq_sum() {
  Impl& I = *impl_;
  if (!I.reduced) reduce_gradients();
  NoGradGuard ng;
  double total = 0;
  for (size_t i = 0; i < I.segs.size(); ++i) {
    const Segment& s = I.segs[i];
    const auto [lo, hi] = I.overlap(s);
    if (!I.sync->has_grad(static_cast<int>(i)) || hi <= lo || s.norm_weight == 0 || I.meta)
      continue;
    const Shard& sh = I.shards[static_cast<size_t>(s.bucket)];
    total += grad_stat(I.grad[static_cast<size_t>(s.bucket)].narrow(0, lo - sh.begin, hi - lo),
                       GradStat::sum_of_squares) *
             s.norm_weight;
  }
  return zero1_norm_sum(total, I.opts.norm_groups, *I.dp);
}

void zero1_all_gather(Communicator& dp, const void* mine, void* flat, int64_t shard_numel,
                      DType dtype) {
  if (dp.size() > 1) dp.all_gather(mine, flat, shard_numel, dtype);
}

double zero1_norm_sum(double local, const NormGroups& groups, Communicator& dp) {
  for (Communicator* g : {groups.tp.get(), groups.pp.get(), groups.ep.get(), &dp})
    if (g && g->size() > 1) g->all_reduce(&local, &local, 1, DType::f64, ReduceOp::sum);
  return local;
}

void Zero1Optimizer::scale_grads(float c) {
  Impl& I = *impl_;
  if (I.meta) return;
  std::vector<int64_t> sizes;
  for (const Tensor& g : I.grad) sizes.push_back(g.numel());
  detail::for_each_item(sizes, 1, [&](size_t j, int64_t b, int64_t e) {
    float* g = I.grad[j].data<float>();
    for (int64_t k = b; k < e; ++k) g[k] *= c;
  });
}

double Zero1Optimizer::clip_grad_norm(double max_norm) {
  // the dense parameters' sum first, then the experts' (every rank in the same order)
  double total = grad_sq_sum();
  if (experts_) total += experts_->grad_sq_sum();
  const double norm = std::sqrt(total);
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      scale_grads(static_cast<float>(coef));
      if (experts_) experts_->scale_grads(static_cast<float>(coef));
    }
  }
  return norm;
}

void Zero1Optimizer::step() {
  Impl& I = *impl_;
  if (!I.reduced) reduce_gradients();
  NoGradGuard ng;
  const int n = I.dp->size();
  const OffloadSchedule offload = I.offload_schedule(precision_);
  I.offload_waited = 0;
  for (size_t b = 0; b < I.shards.size(); ++b) {
    const Shard& sh = I.shards[b];
    // A parameter re-pointed since (another optimizer built on the same model moved it into its
    // own buffer) comes back, with its current values.
    if (!I.sharded(b))
      for (int i : sh.segs)
        if (!I.bound(I.segs[static_cast<size_t>(i)])) I.bind(I.segs[static_cast<size_t>(i)]);
    // this rank's block of the parameters, updated in place, then all-gathered in place
    const Tensor mine = I.param_shard(b);
    if (I.meta) {  // shapes only: the step counts, the update's charge, offload's round trip and
                   // the all-gather
      int64_t numel = 0;
      for (int i : sh.segs) {
        Segment& s = I.segs[static_cast<size_t>(i)];
        if (!I.sync->has_grad(i)) continue;
        ++s.step;
        const auto [lo, hi] = I.overlap(s);
        numel += std::max<int64_t>(0, hi - lo);
      }
      I.charge(sh, numel);
      I.offload_waited += offload.wait(b);
      if (!I.sharded(b)) zero1_all_gather(*I.dp, nullptr, nullptr, sh.size, sh.param_dtype);
      continue;
    }
    // the shard's f32 values: the masters, the parameters themselves (f32), or an f32 copy of
    // the shard (bf16 without masters: 1/DP of the bucket)
    Tensor work;
    if (I.has_master(sh, precision_)) {
      work = I.master.narrow(0, sh.flat, sh.size);
    } else if (sh.param_dtype == DType::f32) {
      work = mine;
    } else {
      const HostMemoryScope scope(I.state_memory());
      work = zeros({sh.size});
      I.read_params(sh, work.data<float>());
    }
    // the rule on the shard (per segment: its group's lr and wd, its own step count)
    struct Job {
      ElementwiseStep up;
      int seg;
      int64_t lo;  // bucket coordinate of the job's first element
    };
    std::vector<Job> jobs;
    std::vector<int64_t> sizes;
    float* w = work.data<float>();
    float* g = I.grad[b].data<float>();
    for (int i : sh.segs) {
      Segment& s = I.segs[static_cast<size_t>(i)];
      if (!I.sync->has_grad(i)) continue;
      ++s.step;
      const auto [lo, hi] = I.overlap(s);
      if (hi <= lo) continue;
      const int64_t k = lo - sh.begin;
      const ParamGroup& grp = groups_[static_cast<size_t>(s.group)];
      ElementwiseStep e{w + k, g + k, {}, hi - lo, grp.lr, grp.weight_decay, s.step};
      for (size_t q = 0; q < I.state.size(); ++q)
        e.state[q] = I.state[q].data<float>() + sh.flat + k;
      jobs.push_back({e, i, lo});
      sizes.push_back(hi - lo);
    }
    // bf16 parameters: the updated values rounded into the parameters' block as AdamW rounds
    // each element (segments skipped this step keep their values)
    detail::for_each_item(sizes, I.rule.cost, [&](size_t j, int64_t e0, int64_t e1) {
      const Job& job = jobs[j];
      ElementwiseStep part = job.up;
      part.p += e0;
      part.g += e0;
      for (float*& st : part.state)
        if (st) st += e0;
      part.n = e1 - e0;
      I.rule.update(part);
      if (sh.param_dtype != DType::bf16) return;
      const Segment& s = I.segs[static_cast<size_t>(job.seg)];
      const int64_t k = job.lo - sh.begin;
      const RoundingNoise noise(precision_.seed, s.p.name, s.step);
      round_to_bf16(mine.data<bf16>() + k + e0, w + k + e0, e1 - e0,
                    precision_.stochastic_rounding ? &noise : nullptr, job.lo - s.offset + e0);
    });
    int64_t numel = 0;
    for (int64_t z : sizes) numel += z;
    I.charge(sh, numel);
    // every rank's updated block into every rank's buffer, in place (offload: once it is back;
    // stage three: a unit's buffers are gathered at its next use)
    I.offload_waited += offload.wait(b);
    if (!I.sharded(b))
      zero1_all_gather(*I.dp, mine.raw_data(), I.pbuf[b].raw_data(), sh.size, sh.param_dtype);
  }
  I.grad.clear();
  I.reduced = false;
  ++steps_;
  if (experts_) {
    sync_groups();
    experts_->step();
  }
}

void Zero1Optimizer::discard_gradients() {
  Impl& I = *impl_;
  I.grad.clear();
  I.reduced = false;
  if (experts_) experts_->discard_gradients();
}

void Zero1Optimizer::gather_state() {
  Impl& I = *impl_;
  NoGradGuard ng;
  const int n = I.dp->size();
  state_.clear();
  for (size_t b = 0; b < I.shards.size(); ++b) {
    const Shard& sh = I.shards[b];
    const bool masters = I.has_master(sh, precision_);
    auto gather = [&](const Tensor& flat) {
      Tensor full = zeros({sh.size * n});
      I.dp->all_gather(flat.data<float>() + sh.flat, full.data<float>(), sh.size, DType::f32);
      return full;
    };
    std::vector<Tensor> full;
    for (const Tensor& t : I.state) full.push_back(gather(t));
    const Tensor mw = masters ? gather(I.master) : Tensor();
    for (int i : sh.segs) {
      const Segment& s = I.segs[static_cast<size_t>(i)];
      for (size_t q = 0; q < full.size(); ++q)
        add_state(s.p, I.rule.state[q], StateKind::per_element)
            .view({s.size})
            .copy_(full[q].narrow(0, s.offset, s.size));
      *add_state(s.p, "step", StateKind::step_count).data<int64_t>() = s.step;
      if (masters)
        add_state(s.p, "master", StateKind::per_element)
            .view({s.size})
            .copy_(mw.narrow(0, s.offset, s.size));
    }
  }
  if (experts_) {  // over the expert-DP group: this EP rank's experts
    experts_->gather_state();
    state_.insert(state_.end(), experts_->state_.begin(), experts_->state_.end());
  }
}

void Zero1Optimizer::scatter_state() {
  Impl& I = *impl_;
  std::map<std::string, Tensor> by_name(state_.begin(), state_.end());
  if (experts_) {
    experts_->state_ = state_;
    experts_->scatter_state();
  }
  auto find = [&](const Segment& s, const std::string& what) {
    auto it = by_name.find(s.p.name + "." + what);
    NXD_CHECK(it != by_name.end(), "[Zero1Optimizer] scatter_state() needs '", s.p.name, ".", what,
              "' (laid out by gather_state())");
    return it->second.contiguous();
  };
  for (const Shard& sh : I.shards) {
    const bool masters = I.has_master(sh, precision_);
    for (int i : sh.segs) {
      Segment& s = I.segs[static_cast<size_t>(i)];
      s.step = *find(s, "step").data<int64_t>();
      const auto [lo, hi] = I.overlap(s);
      if (hi <= lo) continue;
      const int64_t src = lo - s.offset, dst = sh.flat + (lo - sh.begin);
      for (size_t q = 0; q < I.state.size(); ++q)
        std::copy_n(find(s, I.rule.state[q]).data<float>() + src, hi - lo,
                    I.state[q].data<float>() + dst);
      if (masters)
        std::copy_n(find(s, "master").data<float>() + src, hi - lo, I.master.data<float>() + dst);
    }
  }
}

void Zero1Optimizer::gather_parameters() {
  for (auto& u : impl_->units) u->materialize();
  if (experts_) experts_->gather_parameters();
}

void Zero1Optimizer::release_parameters() {
  for (auto& u : impl_->units) u->write_back_and_release();
  if (experts_) experts_->release_parameters();
}

int64_t Zero1Optimizer::resident_parameter_bytes() const {
  const Impl& I = *impl_;
  int64_t n = 0;
  for (size_t b = 0; b < I.pbuf.size(); ++b)
    n += I.sharded(b) ? I.pshard[b].nbytes() : I.pbuf[b].nbytes();
  return n + (experts_ ? experts_->resident_parameter_bytes() : 0);
}

void Zero1Optimizer::release_state() {
  state_.clear();
  if (experts_) experts_->release_state();
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

std::vector<StateShard> Zero1Optimizer::sharded_state() const {
  const Impl& I = *impl_;
  std::vector<StateShard> out;
  out.reserve(I.segs.size());
  for (const Segment& s : I.segs) {
    const Shard& sh = I.shards[static_cast<size_t>(s.bucket)];
    const auto [lo, hi] = I.overlap(s);
    // an empty range still lists the state names (zero-size views)
    const bool held = hi > lo;
    const int64_t n = held ? hi - lo : 0, at = sh.flat + (held ? lo - sh.begin : 0);
    StateShard r{
        s.p.name, s.p.param.shape(), held ? lo - s.offset : 0, held ? hi - s.offset : 0, s.step,
        {}};
    for (size_t q = 0; q < I.state.size(); ++q)
      r.tensors.emplace_back(I.rule.state[q], I.state[q].narrow(0, at, n));
    if (I.has_master(sh, precision_)) r.tensors.emplace_back("master", I.master.narrow(0, at, n));
    out.push_back(std::move(r));
  }
  if (experts_)
    for (StateShard& r : experts_->sharded_state()) out.push_back(std::move(r));
  return out;
}

void Zero1Optimizer::load_sharded_state(const std::vector<StateShard>& records) {
  const std::vector<StateShard> mine = sharded_state();
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < mine.size(); ++i) index[mine[i].param] = i;
  // check everything before copying anything
  for (const StateShard& r : records) {
    const auto it = index.find(r.param);
    NXD_CHECK(it != index.end(), "[Zero1Optimizer] load_sharded_state: no parameter '", r.param,
              "'");
    const StateShard& m = mine[it->second];
    NXD_CHECK(r.shape == m.shape && r.lo == m.lo && r.hi == m.hi,
              "[Zero1Optimizer] load_sharded_state: parameter '", r.param, "' ", shape_str(r.shape),
              " elements [", r.lo, ", ", r.hi, ") given, this rank holds ", shape_str(m.shape),
              " elements [", m.lo, ", ", m.hi, ")");
    for (const auto& [what, t] : r.tensors) {
      const auto have = std::find_if(m.tensors.begin(), m.tensors.end(),
                                     [&](const auto& x) { return x.first == what; });
      NXD_CHECK(have != m.tensors.end(), "[Zero1Optimizer] load_sharded_state: parameter '",
                r.param, "' has no state '", what, "' here");
      NXD_CHECK(t.shape() == have->second.shape() && t.dtype() == DType::f32,
                "[Zero1Optimizer] load_sharded_state: '", r.param, ".", what, "' is ", t.desc(),
                ", expected f32", shape_str(have->second.shape()));
    }
  }
  NoGradGuard ng;
  std::vector<StateShard> ex;  // the experts' step counts (their tensors are copied here)
  for (const StateShard& r : records) {
    const StateShard& m = mine[index.at(r.param)];
    for (const auto& [what, t] : r.tensors)
      for (const auto& [w, live] : m.tensors)
        if (w == what) live.copy_(t);
    if (r.step < 0) continue;
    if (index.at(r.param) < impl_->segs.size())
      impl_->segs[index.at(r.param)].step = r.step;
    else
      ex.push_back({r.param, r.shape, r.lo, r.hi, r.step, {}});
  }
  if (experts_) experts_->load_sharded_state(ex);
}

}  // namespace nxd::optim

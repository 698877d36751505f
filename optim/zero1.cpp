#include "nxd/optim/zero1.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "nxd/collectives/parallel_state.h"
#include "nxd/optim/adamw_update.h"
#include "nxd/runtime/error.h"

namespace nxd::optim {

namespace {

// One parameter's place in the flat buffer and what the norm and the update need of it.
struct Segment {
  NamedParam p;
  int group = 0;
  int64_t offset = 0, size = 0;
  double norm_weight = 1.0;  // 0: not counted on this rank (TP duplicate, shared)
  int64_t step = 0;
};

}  // namespace

struct Zero1AdamW::Impl {
  Zero1Options opts;
  std::shared_ptr<Communicator> dp;
  std::vector<Segment> segs;
  int64_t total = 0, shard = 0;  // padded total = shard * dp
  Tensor m, v;                   // [shard]
  Tensor grad_shard;             // [shard]: the reduced gradient of this step (undefined: none)
  std::vector<bool> has_grad;    // per segment, on some DP rank (with grad_shard)

  int64_t begin() const { return static_cast<int64_t>(dp->rank()) * shard; }
  // The part of segment s inside this rank's shard: [lo, hi) in flat coordinates.
  std::pair<int64_t, int64_t> overlap(const Segment& s) const {
    return {std::max(s.offset, begin()), std::min(s.offset + s.size, begin() + shard)};
  }
};

Zero1AdamW::Zero1AdamW(std::vector<ParamGroup> groups, Zero1Options opts)
    : Optimizer(std::move(groups), "AdamW"), impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.opts = std::move(opts);
  const auto& a = I.opts.adamw;
  NXD_CHECK(a.beta1 >= 0 && a.beta1 < 1 && a.beta2 >= 0 && a.beta2 < 1 && a.eps >= 0,
            "[Zero1AdamW] need beta1, beta2 in [0, 1) and eps >= 0, got ", a.beta1, ", ", a.beta2,
            ", ", a.eps);
  I.dp = I.opts.dp_group ? I.opts.dp_group
         : parallel_state::model_parallel_is_initialized()
             ? parallel_state::get_data_parallel_group_ptr()
             : make_self_communicator();
  std::map<std::string, const NormParam*> attrs;
  for (const auto& np : I.opts.norm_params) attrs[np.name] = &np;
  const auto& tp = I.opts.norm_groups.tp;
  const int tp_size = tp ? tp->size() : 1, tp_rank = tp ? tp->rank() : 0;
  for (size_t g = 0; g < groups_.size(); ++g)
    for (const NamedParam& p : groups_[g].params) {
      NXD_CHECK(p.param.dtype() == DType::f32, "[Zero1AdamW] parameter '", p.name, "' is ",
                p.param.desc(), ": ZeRO-1 shards f32 parameters only");
      Segment s{p, static_cast<int>(g), I.total, p.param.numel()};
      if (auto it = attrs.find(p.name); it != attrs.end()) {
        const NormParam& n = *it->second;
        const bool sharded = n.attrs.tensor_model_parallel && tp_size > 1;
        s.norm_weight = n.shared || (!sharded && tp_rank != 0)
                            ? 0.0
                            : 1.0 / static_cast<double>(sharded ? n.attrs.kv_replicas : 1);
      }
      I.total += s.size;
      I.segs.push_back(s);
    }
  const int n = I.dp->size();
  I.shard = (I.total + n - 1) / n;
  I.m = zeros({I.shard});
  I.v = zeros({I.shard});
}

Zero1AdamW::~Zero1AdamW() = default;

int Zero1AdamW::dp_size() const {
  return impl_->dp->size();
}
int64_t Zero1AdamW::shard_elements() const {
  return impl_->shard;
}
int64_t Zero1AdamW::state_bytes() const {
  return impl_->m.nbytes() + impl_->v.nbytes();
}

void Zero1AdamW::reduce_gradients() {
  Impl& I = *impl_;
  NoGradGuard ng;
  const int n = I.dp->size();
  std::vector<double> has(I.segs.size());
  Tensor flat = zeros({I.shard * n});
  float* f = flat.data<float>();
  for (size_t i = 0; i < I.segs.size(); ++i) {
    const Segment& s = I.segs[i];
    Tensor g = s.p.param.grad();
    if (!g.defined()) continue;
    NXD_CHECK_SHAPE(g.shape() == s.p.param.shape(), "[Zero1AdamW] gradient of '", s.p.name, "' is ",
                    g.desc(), ", parameter is ", s.p.param.desc());
    has[i] = 1.0;
    Tensor c = g.to(DType::f32).contiguous();
    std::copy_n(c.data<float>(), s.size, f + s.offset);
  }
  if (n > 1)
    I.dp->all_reduce(has.data(), has.data(), static_cast<int64_t>(has.size()), DType::f64,
                     ReduceOp::max);
  I.has_grad.assign(I.segs.size(), false);
  for (size_t i = 0; i < has.size(); ++i) I.has_grad[i] = has[i] > 0;
  I.grad_shard = zeros({I.shard});
  if (n > 1)
    I.dp->reduce_scatter(f, I.grad_shard.data<float>(), I.shard, DType::f32, ReduceOp::avg);
  else
    std::copy_n(f, I.shard, I.grad_shard.data<float>());
}

double Zero1AdamW::clip_grad_norm(double max_norm) {
  Impl& I = *impl_;
  if (!I.grad_shard.defined()) reduce_gradients();
  NoGradGuard ng;
  double total = 0;
  for (size_t i = 0; i < I.segs.size(); ++i) {
    const Segment& s = I.segs[i];
    const auto [lo, hi] = I.overlap(s);
    if (!I.has_grad[i] || hi <= lo || s.norm_weight == 0) continue;
    total += grad_stat(I.grad_shard.narrow(0, lo - I.begin(), hi - lo), false) * s.norm_weight;
  }
  for (const auto& g : {I.opts.norm_groups.tp, I.opts.norm_groups.pp, I.dp})
    if (g && g->size() > 1) g->all_reduce(&total, &total, 1, DType::f64, ReduceOp::sum);
  const double norm = std::sqrt(total);
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      const float c = static_cast<float>(coef);
      float* g = I.grad_shard.data<float>();
      for (int64_t k = 0; k < I.shard; ++k) g[k] *= c;
    }
  }
  return norm;
}

void Zero1AdamW::step() {
  Impl& I = *impl_;
  if (!I.grad_shard.defined()) reduce_gradients();
  NoGradGuard ng;
  const int n = I.dp->size();
  // this rank's shard of the parameters
  Tensor flat = zeros({I.shard * n});
  float* p = flat.data<float>() + I.begin();
  for (const Segment& s : I.segs) {
    const auto [lo, hi] = I.overlap(s);
    if (hi > lo)
      std::copy_n(s.p.param.contiguous().data<float>() + (lo - s.offset), hi - lo,
                  p + (lo - I.begin()));
  }
  const auto& a = I.opts.adamw;
  for (size_t i = 0; i < I.segs.size(); ++i) {
    Segment& s = I.segs[i];
    if (!I.has_grad[i]) continue;
    ++s.step;
    const auto [lo, hi] = I.overlap(s);
    if (hi <= lo) continue;
    const int64_t k = lo - I.begin();
    const ParamGroup& grp = groups_[static_cast<size_t>(s.group)];
    detail::AdamWUpdate<float> up(p + k, I.grad_shard.data<float>() + k, I.m.data<float>() + k,
                                  I.v.data<float>() + k, grp.lr, grp.weight_decay, a.beta1, a.beta2,
                                  a.eps, s.step);
    up(0, hi - lo);
  }
  // every rank's updated shard into every parameter
  if (n > 1) {
    Tensor mine = flat.narrow(0, I.begin(), I.shard).clone();
    I.dp->all_gather(mine.data<float>(), flat.data<float>(), I.shard, DType::f32);
  }
  for (const Segment& s : I.segs) {
    Tensor dst = s.p.param.detach();
    NXD_CHECK(dst.is_contiguous(), "[Zero1AdamW] parameter '", s.p.name, "' is not contiguous");
    std::copy_n(flat.data<float>() + s.offset, s.size, dst.data<float>());
  }
  I.grad_shard = Tensor();
  ++steps_;
}

void Zero1AdamW::gather_state() {
  Impl& I = *impl_;
  NoGradGuard ng;
  const int n = I.dp->size();
  Tensor m = zeros({I.shard * n}), v = zeros({I.shard * n});
  I.dp->all_gather(I.m.data<float>(), m.data<float>(), I.shard, DType::f32);
  I.dp->all_gather(I.v.data<float>(), v.data<float>(), I.shard, DType::f32);
  state_.clear();
  for (const Segment& s : I.segs) {
    Tensor em = add_state(s.p, "exp_avg", false), ev = add_state(s.p, "exp_avg_sq", false);
    Tensor st = add_state(s.p, "step", true);
    std::copy_n(m.data<float>() + s.offset, s.size, em.data<float>());
    std::copy_n(v.data<float>() + s.offset, s.size, ev.data<float>());
    *st.data<int64_t>() = s.step;
  }
}

void Zero1AdamW::scatter_state() {
  Impl& I = *impl_;
  NXD_CHECK(state_.size() == 3 * I.segs.size(),
            "[Zero1AdamW] scatter_state() needs the state gather_state() laid out, got ",
            state_.size(), " tensors for ", I.segs.size(), " parameters");
  for (size_t i = 0; i < I.segs.size(); ++i) {
    Segment& s = I.segs[i];
    const Tensor em = state_[3 * i].second.contiguous(), ev = state_[3 * i + 1].second.contiguous();
    s.step = *state_[3 * i + 2].second.data<int64_t>();
    const auto [lo, hi] = I.overlap(s);
    if (hi <= lo) continue;
    std::copy_n(em.data<float>() + (lo - s.offset), hi - lo, I.m.data<float>() + (lo - I.begin()));
    std::copy_n(ev.data<float>() + (lo - s.offset), hi - lo, I.v.data<float>() + (lo - I.begin()));
  }
}

void Zero1AdamW::release_state() {
  state_.clear();
}

}  // namespace nxd::optim

// Zero1Optimizer's step (optim/zero1.h): the gradients reduced into this rank's shards, the
// elementwise rule on each bucket's shard, the updated shards all-gathered into every rank's flat
// parameter buffers.
#include "nxd/optim/items.h"
#include "nxd/optim/zero1_impl.h"

namespace nxd::optim {

using Impl = Zero1Optimizer::Impl;
using zero1_detail::Segment;
using zero1_detail::Shard;

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

int64_t Impl::count_meta_update(const Shard& sh) {
  int64_t numel = 0;
  for (int i : sh.segs) {
    Segment& s = segs[static_cast<size_t>(i)];
    if (!sync->has_grad(i)) continue;
    ++s.step;
    const auto [lo, hi] = overlap(s);
    numel += std::max<int64_t>(0, hi - lo);
  }
  return numel;
}

int64_t Impl::update_shard(size_t b, const Tensor& mine, const std::vector<ParamGroup>& groups,
                           const PrecisionOptions& p) {
  const Shard& sh = shards[b];
  // the shard's f32 values: the masters, the parameters themselves (f32), or an f32 copy of
  // the shard (bf16 without masters: 1/DP of the bucket)
  Tensor work;
  if (has_master(sh, p)) {
    work = master.narrow(0, sh.flat, sh.size);
  } else if (sh.param_dtype == DType::f32) {
    work = mine;
  } else {
    const HostMemoryScope scope(state_memory());
    work = zeros({sh.size});
    read_params(sh, work.data<float>());
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
  float* g = grad[b].data<float>();
  for (int i : sh.segs) {
    Segment& s = segs[static_cast<size_t>(i)];
    if (!sync->has_grad(i)) continue;
    ++s.step;
    const auto [lo, hi] = overlap(s);
    if (hi <= lo) continue;
    const int64_t k = lo - sh.begin;
    const ParamGroup& grp = groups[static_cast<size_t>(s.group)];
    ElementwiseStep e{w + k, g + k, {}, hi - lo, grp.lr, grp.weight_decay, s.step};
    for (size_t q = 0; q < state.size(); ++q) e.state[q] = state[q].data<float>() + sh.flat + k;
    jobs.push_back({e, i, lo});
    sizes.push_back(hi - lo);
  }
  // bf16 parameters: the updated values rounded into the parameters' block as AdamW rounds
  // each element (segments skipped this step keep their values)
  detail::for_each_item(sizes, rule.cost, [&](size_t j, int64_t e0, int64_t e1) {
    const Job& job = jobs[j];
    ElementwiseStep part = job.up;
    part.p += e0;
    part.g += e0;
    for (float*& st : part.state)
      if (st) st += e0;
    part.n = e1 - e0;
    rule.update(part);
    if (sh.param_dtype != DType::bf16) return;
    const Segment& s = segs[static_cast<size_t>(job.seg)];
    const int64_t k = job.lo - sh.begin;
    const RoundingNoise noise(p.seed, s.p.name, s.step);
    round_to_bf16(mine.data<bf16>() + k + e0, w + k + e0, e1 - e0,
                  p.stochastic_rounding ? &noise : nullptr, job.lo - s.offset + e0);
  });
  int64_t numel = 0;
  for (int64_t z : sizes) numel += z;
  return numel;
}

void Zero1Optimizer::step() {
  Impl& I = *impl_;
  if (!I.reduced) reduce_gradients();
  NoGradGuard ng;
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
      I.charge(sh, I.count_meta_update(sh));
      I.offload_waited += offload.wait(b);
      if (!I.sharded(b)) zero1_all_gather(*I.dp, nullptr, nullptr, sh.size, sh.param_dtype);
      continue;
    }
    I.charge(sh, I.update_shard(b, mine, groups_, precision_));
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

void zero1_all_gather(Communicator& dp, const void* mine, void* flat, int64_t shard_numel,
                      DType dtype) {
  if (dp.size() > 1) dp.all_gather(mine, flat, shard_numel, dtype);
}

}  // namespace nxd::optim

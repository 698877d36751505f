#pragma once
// Zero1Optimizer's state (optim/zero1.h), private to nxd_optim and shared by its files:
// zero1.cpp (construction: the buckets' layout, the shards, the state), zero1_step.cpp (reduce
// and update), zero1_norm.cpp (the gradient norm and clipping), zero1_state.cpp (the optimizer
// state for checkpoints), zero1_stage3.cpp (stage three: the units' parameters).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "nxd/optim/meta_update.h"
#include "nxd/optim/offload.h"
#include "nxd/optim/zero1.h"
#include "nxd/optim/zero3_unit.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/host_memory.h"

namespace nxd::optim {

namespace zero1_detail {

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

}  // namespace zero1_detail

struct Zero1Optimizer::Impl {
  using Segment = zero1_detail::Segment;
  using Shard = zero1_detail::Shard;

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
  // Stage three (zero1_stage3.cpp): each unit's buckets sharded (unit_of: per segment, 1 + its
  // unit's index in opts.units, 0 none).
  void build_units(const std::vector<int>& unit_of);
  // Stage three: the modules of opts' units in their order (layers, lookups, roots).
  UnitModules unit_modules() const;
  // step() (zero1_step.cpp): the elementwise rule on bucket b's shard `mine` (updated in place),
  // returning the elements updated; the step counts of the segments with a gradient advance.
  int64_t update_shard(size_t b, const Tensor& mine, const std::vector<ParamGroup>& groups,
                       const PrecisionOptions& p);
  // The same on meta parameters: the step counts advance and the elements are counted.
  int64_t count_meta_update(const Shard& sh);
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

}  // namespace nxd::optim

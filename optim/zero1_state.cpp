// Zero1Optimizer's optimizer state outside the step (optim/zero1.h): the per-parameter records
// of this rank's shards for checkpoints (sharded_state, load_sharded_state) and the full state
// gathered over DP under AdamW's names (gather_state, scatter_state, release_state).
#include <map>
#include <string>

#include "nxd/optim/zero1_impl.h"

namespace nxd::optim {

using Impl = Zero1Optimizer::Impl;
using zero1_detail::Segment;
using zero1_detail::Shard;

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

void Zero1Optimizer::release_state() {
  state_.clear();
  if (experts_) experts_->release_state();
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

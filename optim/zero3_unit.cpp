#include "nxd/optim/zero3_unit.h"

#include <map>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/runtime/error.h"

namespace nxd::optim {

ShardedUnit::ShardedUnit(std::shared_ptr<Communicator> dp, bool reshard_after_forward,
                         UnitPrefetch prefetch)
    : dp_(std::move(dp)), reshard_(reshard_after_forward), prefetch_(prefetch) {}

void ShardedUnit::add_bucket(Tensor full, Tensor shard) {
  NXD_CHECK(full.numel() == shard.numel() * dp_->size() && full.dtype() == shard.dtype(),
            "[ShardedUnit] full buffer ", full.desc(), " is not ", dp_->size(), " x the shard ",
            shard.desc());
  full_.push_back(std::move(full));
  shard_.push_back(std::move(shard));
}

void ShardedUnit::set_neighbours(std::weak_ptr<ShardedUnit> prev, std::weak_ptr<ShardedUnit> next) {
  prev_ = std::move(prev);
  next_ = std::move(next);
}

void ShardedUnit::start() {
  NoGradGuard ng;
  work_.clear();
  reserve();
  for (size_t b = 0; b < full_.size(); ++b) {
    work_.push_back(dp_->iall_gather(shard_[b], full_[b]));
  }
  state_ = State::in_flight;
}

void ShardedUnit::reserve() {
  for (Tensor& f : full_) f.storage()->reallocate();  // a no-op where it has its memory
}

int64_t ShardedUnit::full_bytes() const {
  int64_t n = 0;
  for (const Tensor& f : full_) n += f.storage()->nbytes();
  return n;
}

void ShardedUnit::wait() {
  for (Work& w : work_) w.wait();
  work_.clear();
  state_ = State::gathered;
}

void ShardedUnit::prefetch(const std::weak_ptr<ShardedUnit>& u) {
  if (auto p = u.lock(); p && p->state_ == State::released) p->start();
}

void ShardedUnit::materialize() {
  if (state_ == State::released) start();
  wait();
}

void ShardedUnit::gather(UnitPass pass) {
  materialize();
  if (pass == UnitPass::outside) held_whole_ = true;
  if (pass != UnitPass::outside && prefetch_ == UnitPrefetch::next_unit)
    prefetch(pass == UnitPass::forward ? next_ : prev_);
}

void ShardedUnit::release(UnitPass pass) {
  if (pass == UnitPass::outside) return write_back_and_release();
  if (state_ != State::released) wait();
  for (Tensor& f : full_) f.storage()->release_data();  // a no-op where it has none (reserve())
  state_ = State::released;
  held_whole_ = false;
  if (pass == UnitPass::backward && on_backward_release_) on_backward_release_();
}

void ShardedUnit::write_back_and_release() {
  if (state_ != State::released) {
    wait();
    NoGradGuard ng;
    const int64_t r = dp_->rank();
    for (size_t b = 0; b < full_.size(); ++b)
      if (!full_[b].is_meta())
        shard_[b].copy_(full_[b].narrow(0, r * shard_[b].numel(), shard_[b].numel()));
  }
  release(UnitPass::forward);
}

void link_units(const std::vector<std::shared_ptr<ShardedUnit>>& units,
                const std::vector<int>& chain) {
  NXD_CHECK(chain.empty() || chain.size() == units.size(), "[link_units] ", chain.size(),
            " chains for ", units.size(), " units");
  auto same = [&](size_t a, size_t b) { return chain.empty() || chain[a] == chain[b]; };
  const size_t n = units.size();
  for (size_t u = 0; u < n; ++u)
    units[u]->set_neighbours(u > 0 && same(u - 1, u) ? units[u - 1] : nullptr,
                             u + 1 < n && same(u, u + 1) ? units[u + 1] : nullptr);
}

Module* UnitModules::module(size_t u) const {
  if (u < layers.size()) return layers[u];
  u -= layers.size();
  return u < lookups.size() ? lookups[u] : roots.at(u - lookups.size());
}

std::vector<int> UnitModules::unit_of(const std::vector<NamedParam>& order) const {
  std::map<const TensorImpl*, int> of;
  for (size_t u = 0; u < size(); ++u)
    for (const Tensor& t : module(u)->parameters()) of.emplace(t.impl(), static_cast<int>(u) + 1);
  std::vector<int> out;
  for (const NamedParam& p : order) {
    const auto it = of.find(p.param.impl());
    out.push_back(it == of.end() ? 0 : it->second);
  }
  return out;
}

void add_root_units(const std::vector<Module*>& chunks, UnitModules& out) {
  for (Module* m : chunks) {
    const auto* lm = dynamic_cast<const CausalLM*>(m);
    if (!lm || !lm->decoder_stack()) continue;
    out.roots.push_back(m);
    if (Module* e = lm->decoder_stack()->lookup_unit_module()) out.lookups.push_back(e);
  }
}

void install_units(const std::vector<std::shared_ptr<ShardedUnit>>& units, const UnitModules& m,
                   const GradSync& sync) {
  if (units.empty()) return;  // a sharding group of one rank
  NXD_CHECK(units.size() == m.size(), "[install_units] ", units.size(), " units for ",
            m.layers.size(), " layers, ", m.lookups.size(), " lookups and ", m.roots.size(),
            " roots");
  const size_t n = m.layers.size();
  link_units({units.begin(), units.begin() + static_cast<std::ptrdiff_t>(n)}, m.chain);
  for (size_t u = 0; u < units.size(); ++u) {
    // UnitLaunch::at_release: a layer's release sends its buckets. Not a lookup's or a root's: they
    // are released before the embedding's gradient exists (their buckets go out when complete or
    // at the step).
    if (u < n)
      units[u]->set_on_backward_release(sync.unit_release_callback(static_cast<int>(u) + 1));
    units[u]->release(UnitPass::forward);
    if (u < n || !units[u]->empty()) m.module(u)->set_param_unit(units[u]);
  }
}

std::vector<std::shared_ptr<ShardedUnit>> shard_meta_units(
    const GradSync& sync, const std::vector<int>& unit_of, const UnitModules& m,
    std::shared_ptr<Communicator> dp, bool reshard_after_forward, UnitPrefetch prefetch) {
  std::vector<std::shared_ptr<ShardedUnit>> units;
  if (dp->size() == 1) return units;  // nothing to shard (Zero1Optimizer builds no unit either)
  for (size_t u = 0; u < m.size(); ++u)
    units.push_back(std::make_shared<ShardedUnit>(dp, reshard_after_forward, prefetch));
  const std::vector<std::vector<int>> layout = sync.bucket_layout();
  const int n = sync.dp_size();
  for (int b = 0; b < sync.num_buckets(); ++b) {
    const int u = unit_of.at(static_cast<size_t>(layout[b].at(0)));
    if (u == 0) continue;
    const Tensor& p0 = sync.params()[static_cast<size_t>(layout[b][0])].param;
    NXD_CHECK(p0.is_meta(), "[shard_meta_units] parameter '",
              sync.params()[static_cast<size_t>(layout[b][0])].name, "' is not a meta tensor");
    const int64_t s = sync.shard_numel(b);
    Tensor full = zeros({s * n}, p0.dtype(), Device::meta);
    for (int i : layout[b]) {
      TensorImpl& impl = *sync.params()[static_cast<size_t>(i)].param.impl();
      impl.storage = full.storage();
      impl.offset = sync.offset_in_bucket(i);
      impl.strides = contiguous_strides(impl.shape);
    }
    units[static_cast<size_t>(u - 1)]->add_bucket(full, zeros({s}, p0.dtype(), Device::meta));
  }
  install_units(units, m, sync);
  return units;
}

}  // namespace nxd::optim

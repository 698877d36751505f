#include "nxd/checkpoint/unit_walk.h"

#include <algorithm>

#include "nxd/checkpoint/layout.h"
#include "nxd/collectives/communicator.h"
#include "nxd/optim/zero3_unit.h"

namespace nxd::ckpt::detail {

UnitWalk::UnitWalk(const std::vector<const Module*>& chunks) {
  for (const Module* m : chunks) {
    if (!m) continue;
    // pre-order: a unit nested in another's module (the layers in the root unit's model) claims
    // its parameters after the outer one did
    for (auto& [name, sub] : const_cast<Module*>(m)->named_modules()) {
      if (!sub->param_unit()) continue;
      const int u = size();
      units_.push_back(sub->param_unit());
      for (const Tensor& t : sub->parameters()) owner_[t.storage().get()] = u;
    }
  }
}

int UnitWalk::unit_of(const Tensor& t) const {
  const auto it = owner_.find(t.storage().get());
  return it == owner_.end() ? -1 : it->second;
}

int64_t UnitWalk::largest_unit_bytes() const {
  int64_t n = 0;
  for (const auto& u : units_)
    if (const auto* s = dynamic_cast<const optim::ShardedUnit*>(u.get()))
      n = std::max(n, s->full_bytes());
  return n;
}

std::optional<UnitWalk::Block> UnitWalk::block_of(const Tensor& t) const {
  const int u = unit_of(t);
  if (u < 0) return std::nullopt;
  const auto* unit = dynamic_cast<const optim::ShardedUnit*>(units_[static_cast<size_t>(u)].get());
  NXD_INTERNAL_CHECK(unit != nullptr, "[checkpoint] a ZeRO-3 unit that is not a ShardedUnit");
  const auto& full = unit->full_buffers();
  for (size_t b = 0; b < full.size(); ++b) {
    if (full[b].storage().get() != t.storage().get()) continue;
    NXD_INTERNAL_CHECK(t.is_contiguous(), "[checkpoint] a ZeRO-3 unit tensor that is not a ",
                       "contiguous view of its bucket: ", t.desc());
    const Tensor& shard = unit->shards()[b];
    Block out{.rank = unit->group().rank(), .size = unit->group().size()};
    const int64_t s = shard.numel(), begin = out.rank * s;
    const int64_t o = t.offset() - full[b].offset(), n = t.numel();
    const int64_t a = std::max(o, begin), e = std::min(o + n, begin + s);
    if (e <= a) return out;
    out.lo = a - o;
    out.hi = e - o;
    out.values =
        unit->held_whole() ? full[b].narrow(0, a, e - a) : shard.narrow(0, a - begin, e - a);
    return out;
  }
  return std::nullopt;
}

void UnitWalk::for_each(const char* what, const std::function<void(int)>& visit) const {
  int32_t steps = size();
  Communicator& w = world();
  if (w.size() > 1) w.all_reduce(&steps, &steps, 1, DType::i32, ReduceOp::max);
  for (int u = 0; u < steps; ++u) {
    ParamUnit* unit = u < size() ? units_[static_cast<size_t>(u)].get() : nullptr;
    // released however this step ends; the shards are taken back from the full values only when
    // every rank's visit succeeded (a failed load leaves the model as it was)
    struct Release {
      ParamUnit* unit;
      bool visited = false;
      ~Release() {
        if (unit) unit->release(visited ? UnitPass::outside : UnitPass::forward);
      }
    } release{unit};
    run_agreed(what, [&] {
      if (auto* s = dynamic_cast<optim::ShardedUnit*>(unit)) s->reserve();
    });
    if (unit) unit->gather(UnitPass::outside);
    run_agreed(what, [&] {
      if (unit) visit(u);
    });
    release.visited = true;
  }
}

}  // namespace nxd::ckpt::detail

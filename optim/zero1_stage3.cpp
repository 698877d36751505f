// Zero1Optimizer's stage three (optim/zero1.h, docs/design/fsdp.md): each unit's buckets keep
// this rank's block of the parameters between uses (a ShardedUnit on the unit's module,
// optim/zero3_unit.h); the weights made whole outside a forward and backward.
#include "nxd/optim/zero1_impl.h"

namespace nxd::optim {

// Stage three: each unit's buckets (the lookups' and roots' included) get a persistent shard and a
// ShardedUnit on the unit's module; their full buffers are released. A sharding group of one rank
// (DP x CP 1; the experts' group when EP = DP x CP) has nothing to shard: no unit, the parameters
// stay whole as at stage two (a unit would only add its gathered copy beside a shard of the same
// size).
UnitModules Zero1Optimizer::Impl::unit_modules() const {
  return {.layers = opts.units,
          .chain = opts.unit_chain,
          .lookups = opts.lookup_units,
          .roots = opts.roots};
}

void Zero1Optimizer::Impl::build_units(const std::vector<int>& unit_of) {
  NoGradGuard ng;
  pshard.assign(shards.size(), Tensor());
  if (dp->size() == 1) return;
  const UnitModules modules = unit_modules();
  for (size_t u = 0; u < modules.size(); ++u)
    units.push_back(std::make_shared<ShardedUnit>(dp, opts.reshard_after_forward, opts.prefetch));
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
  install_units(units, modules, *sync);
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

}  // namespace nxd::optim

#pragma once
// ZeRO-3's units (layers/param_unit.h, optim/zero3_unit.h) walked one at a time by save and load:
// a unit gathered, its tensors copied out (save) or in (load), released, then the next. A
// checkpoint of a fully sharded model then needs one unit's full parameters on the device beyond
// its shards, not the whole model's (docs/design/fsdp.md, "Checkpoints").
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "nxd/layers/module.h"
#include "nxd/layers/param_unit.h"

namespace nxd::ckpt::detail {

class UnitWalk {
 public:
  // The units in the chunks' trees, in named_modules() order (the same on every rank of a DP
  // group); a tensor belongs to the innermost unit whose module holds it.
  explicit UnitWalk(const std::vector<const Module*>& chunks);

  int size() const { return static_cast<int>(units_.size()); }
  // The unit whose full buffers a state_dict() tensor views (its storage), or -1: none (the
  // tensor is always present).
  int unit_of(const Tensor& t) const;
  // The most bytes one unit's gather allocates on this rank (0 without units).
  int64_t largest_unit_bytes() const;

  // This rank's block of a unit's tensor (a parameter: a view of one of its buckets' full
  // buffers), with no gather: elements [lo, hi) of the flattened tensor (lo == hi: none), held in
  // `values` (a view of the unit's persistent shard; of the full buffer while the unit is held
  // gathered outside a pass, where writes land until its release). `rank` / `size`: the unit's
  // sharding group. nullopt: t views none of its unit's buckets (a frozen weight of a unit's module
  // that no optimizer shards, e.g. a LoRA base weight): it is held whole.
  struct Block {
    int64_t lo = 0, hi = 0;
    Tensor values;
    int rank = 0, size = 1;
  };
  std::optional<Block> block_of(const Tensor& t) const;

  // For u = 0, 1, ... up to the most units any rank of the world has (so every rank runs the same
  // collectives): unit u's memory reserved, agreed over the world (a rank short of memory fails
  // every rank, before any gather), gathered (collective over its DP group), visit(u) agreed,
  // then released (UnitPass::outside: each rank's shard taken back from the full values). A
  // failure on any rank throws on every rank (run_agreed), the unit released without taking its
  // shards back (its values stay the ones before the walk). `what`
  // prefixes the messages ("[save_checkpoint]").
  void for_each(const char* what, const std::function<void(int)>& visit) const;

 private:
  std::vector<std::shared_ptr<ParamUnit>> units_;
  std::map<const Storage*, int> owner_;
};

}  // namespace nxd::ckpt::detail

#pragma once
// ZeRO-3's unit (optim/zero1.h, stage three; layers/param_unit.h): the flat parameter buffers of
// the gradient buckets that hold one module's parameters. Between uses a rank keeps only its
// block of each bucket (`shard`, persistent, updated in place by the optimizer); the full buffer
// (`full`, whose Storage every parameter of the bucket views) has its memory released. gather()
// reallocates the full buffers and all-gathers the shards into them; in forward it then starts
// the next unit's all-gather (non-blocking, on the DP group's stream), in backward the previous
// unit's, so the next gather of the pass overlaps this unit's compute (FSDP's forward and
// backward prefetch; UnitPrefetch::none leaves it out): at most two units are gathered at a time.
// Neighbours are those of one chain (link_units): under pipeline parallelism a chain is one
// chunk's layers, which the schedule runs as one forward or one backward, so a prefetched unit is
// always the next one the rank runs.
#include <functional>
#include <memory>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/layers/param_unit.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/optim/zero_stage.h"

namespace nxd::optim {

class ShardedUnit : public ParamUnit {
 public:
  ShardedUnit(std::shared_ptr<Communicator> dp, bool reshard_after_forward,
              UnitPrefetch prefetch = UnitPrefetch::next_unit);
  // A bucket's full flat buffer [S * n] and this rank's persistent block of it [S].
  void add_bucket(Tensor full, Tensor shard);
  // The units before and after this one in forward order (prefetch targets).
  void set_neighbours(std::weak_ptr<ShardedUnit> prev, std::weak_ptr<ShardedUnit> next);
  // Called once the unit's backward is done, as it releases (GradSync::unit_release_callback:
  // UnitLaunch::at_release launches its buckets there).
  void set_on_backward_release(std::function<void()> f) { on_backward_release_ = std::move(f); }

  void gather(UnitPass pass) override;
  void release(UnitPass pass) override;
  bool reshard_after_forward() const override { return reshard_; }

  // Gathered with no prefetch (FSDP's summon_full_params).
  void materialize();
  // Takes this rank's shard back from the full buffers (they were written: a checkpoint load),
  // then releases them. A unit only reserved (below) is released with no write-back.
  void write_back_and_release();
  // The bytes a gather allocates on this rank (its full buffers).
  int64_t full_bytes() const;
  // The full buffers' memory allocated but not gathered: the one step of a gather that can fail
  // on one rank alone (OutOfDeviceMemory), so a caller can agree on it over the ranks before the
  // collective (checkpoint save and load walk the units this way). gather() then only fills them;
  // release() frees them either way.
  void reserve();
  bool gathered() const override { return state_ != State::released; }
  bool held_whole() const override { return held_whole_; }
  bool empty() const { return full_.empty(); }
  // The buckets' full flat buffers (their memory released between gathers; the parameters view
  // their Storage) and this rank's persistent blocks of them, in the same order: block b is
  // elements [rank * S_b, (rank + 1) * S_b) of full b (a checkpoint writes it without a gather).
  const std::vector<Tensor>& full_buffers() const { return full_; }
  const std::vector<Tensor>& shards() const { return shard_; }
  // The sharding group (the unit's DP group).
  const Communicator& group() const { return *dp_; }

 private:
  enum class State { released, in_flight, gathered };
  void start();  // reallocates and launches the all-gathers
  void wait();
  void prefetch(const std::weak_ptr<ShardedUnit>& u);

  std::shared_ptr<Communicator> dp_;
  bool reshard_ = true;
  UnitPrefetch prefetch_ = UnitPrefetch::next_unit;
  std::vector<Tensor> full_, shard_;
  std::vector<Work> work_;
  State state_ = State::gathered;  // the buffers start full (the optimizer releases them)
  bool held_whole_ = false;        // gathered by UnitPass::outside, not released since
  std::weak_ptr<ShardedUnit> prev_, next_;
  std::function<void()> on_backward_release_;
};

// Makes each unit the prefetch neighbour of the units before and after it in forward order that
// are in its chain (`chain[u]`: unit u's chain, e.g. its pipeline chunk; empty: one chain). The
// first and last unit of a chain prefetch nothing across it: another chain (a pipeline chunk) is
// not what the schedule runs next (1F1B and interleaved alternate forwards and backwards of
// different chunks and microbatches).
void link_units(const std::vector<std::shared_ptr<ShardedUnit>>& units,
                const std::vector<int>& chain);

// The modules of ZeRO-3's units, numbered in this order from 1 (GradSyncOptions::units): the
// layers (run through run_param_unit, prefetching their neighbours in `chain`), the lookup units
// (run through run_lookup_unit: a token embedding, gathered for its lookup alone) and the root
// units (FSDP's root: the parameters of a model chunk in no other unit, gathered by RootUnitScope).
// A parameter belongs to the first unit whose module holds it. Neither lookups nor roots prefetch
// or are prefetched, and their buckets are left out of UnitLaunch::at_release (a lookup is released
// in its forward, a root before the embedding's gradient exists).
struct UnitModules {
  std::vector<Module*> layers;
  std::vector<int> chain;  // per layer its prefetch chain; empty: one
  std::vector<Module*> lookups, roots;
  size_t size() const { return layers.size() + lookups.size() + roots.size(); }
  bool empty() const { return size() == 0; }
  Module* module(size_t u) const;  // unit u's (0-based)
  // Per parameter of `order` its unit (1 + its place above), 0 for none.
  std::vector<int> unit_of(const std::vector<NamedParam>& order) const;
  // GradSyncOptions::first_root_unit: the first unit outside the layers.
  int first_root_unit() const { return static_cast<int>(layers.size()) + 1; }
};

// The root and lookup units of a model's chunks (one model, or a pipeline rank's parts), as
// NxDOptimizer and nxd-plan shard them: every CausalLM on a DecoderStack is a root, and its token
// embedding a lookup unit unless a tied head on that chunk reads it (DecoderStack::
// lookup_unit_module). Other modules: none.
void add_root_units(const std::vector<Module*>& chunks, UnitModules& out);

// The units (one per module of `m`, in its order) put to work: the layers' units linked within
// `m.chain` (link_units), every unit released and set on its module (a lookup or root unit
// without buckets is not: its module's parameters stay as they are); with UnitLaunch::at_release
// each layer's release sends its buckets (`sync`). No units: nothing.
void install_units(const std::vector<std::shared_ptr<ShardedUnit>>& units, const UnitModules& m,
                   const GradSync& sync);

// nxd-plan's meta model laid out as Zero1Optimizer lays out stage three: the parameters of each
// of `sync`'s buckets of a unit (`unit_of` per parameter, as given to GradSyncOptions::units:
// UnitModules::unit_of) become views of a flat meta buffer [S * n], released, beside a meta shard
// [S]; the units are installed (install_units). `dp`: the sharding group (the GradSync's); of one
// rank: no unit (as Zero1Optimizer). The other parameters are left as they are.
std::vector<std::shared_ptr<ShardedUnit>> shard_meta_units(
    const GradSync& sync, const std::vector<int>& unit_of, const UnitModules& m,
    std::shared_ptr<Communicator> dp, bool reshard_after_forward, UnitPrefetch prefetch);

}  // namespace nxd::optim

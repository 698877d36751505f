// ZeRO-3 checkpoints (docs/design/fsdp.md, "Checkpoints"): the per-rank save (the default) writes
// each DP rank's blocks with no gather, adding nothing full-size to the device; the gathered save
// (Zero3ModelFiles::gathered) and every load gather one unit (decoder layer) at a time, so beyond
// its sharded state a rank needs about one unit's full weights on the device, where gathering the
// whole model at once (WholeParameters, the earlier save and load) needs every layer's. Measured
// with the sim allocator on a 16-layer model at DP 4, sync and async saves, and under a device
// capacity the whole-model gather does not fit: save and load succeed there, bitwise.
#include <gtest/gtest.h>

#include <cstdio>
#include <mutex>

#include "nxd/checkpoint/unit_walk.h"
#include "nxd/layers/param_unit.h"
#include "nxd/runtime/host_memory.h"
#include "support/files.h"
#include "support/ranks.h"
#include "zero1_util.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
using nxd::testing::run_ranks;
using nxd::testing::shard_snapshot;
using nxd::testing::shards_of;
using nxd::testing::Zero1Trainee;

// A unit's parameters in one bucket of their own (GradSyncOptions::units closes buckets at units).
nxd::testing::TraineeOptions sixteen_layers(uint64_t seed = 1) {
  return {.zero1 = true,
          .seed = seed,
          .stage = optim::ZeroStage::three,
          .bucket_bytes = 1 << 20,
          .layers = 16,
          .hidden = 64};
}

// Every model tensor, the units gathered for the copy.
std::map<std::string, Tensor> model_values(const Module& m) {
  const WholeParameters whole({&m});
  return nxd::testing::snapshot(m, nullptr);
}

struct Peaks {
  std::mutex mu;
  int64_t resident = 0, unit = 0, whole = 0, save = 0, async_save = 0, load = 0;
  int64_t rank_save = 0, rank_async_save = 0, rank_host = 0, gathered_host = 0;
  void max(int64_t& into, int64_t v) {
    std::lock_guard<std::mutex> l(mu);
    into = std::max(into, v);
  }
};

// The device allocator's peak over f() above what was live before it.
int64_t peak_of(const std::function<void()>& f) {
  MemoryCounter& mem = current_context().memory();
  const int64_t before = mem.live();
  mem.reset_peak();
  f();
  return mem.peak() - before;
}

TEST(Zero3Checkpoint, SaveAndLoadGatherOneUnitAtATime) {
  const nxd::testing::ScratchDir dir("nxd_z3ckpt_");
  Peaks pk;
  run_ranks(4, [&] {
    parallel_state::initialize_model_parallel(1);
    const int d = parallel_state::get_data_parallel_rank();
    Zero1Trainee a(1, sixteen_layers());
    ASSERT_EQ(a.zero1()->stage(), optim::ZeroStage::three);
    a.step(0, shards_of(d, 4));
    a.step(1, shards_of(d, 4));
    pk.max(pk.resident, current_context().memory().live());  // the model, state and schedule
    const auto model = model_values(*a.model);
    const auto state = shard_snapshot(*a.opt);
    const int64_t unit = detail::UnitWalk({a.model.get()}).largest_unit_bytes();
    pk.max(pk.unit, unit);
    constexpr auto gathered = Zero3ModelFiles::gathered;
    pk.max(pk.save, peak_of([&] {
             save_checkpoint(dir.path, "sync", a.model.get(), a.opt.get(), a.sched.get(), nullptr,
                             {.zero3_files = gathered});
           }));
    pk.max(pk.rank_save, peak_of([&] {
             save_checkpoint(dir.path, "sync_rank", a.model.get(), a.opt.get(), a.sched.get());
           }));
    const int64_t held = current_context().memory().live(), host = host_memory().live();
    pk.max(pk.async_save, peak_of([&] {
             save_checkpoint(dir.path, "async", a.model.get(), a.opt.get(), a.sched.get(), nullptr,
                             {.async_save = true, .zero3_files = gathered});
             finalize_checkpoint();
           }));
    // the snapshots kept for the next async save are host tensors, no gathered device buffer
    EXPECT_EQ(current_context().memory().live(), held);
    if (d == 0) {
      EXPECT_GE(host_memory().live() - host, 16 * unit);
    }
    pk.max(pk.gathered_host, host_memory().live() - host);
    // per rank: the async snapshot is this rank's blocks (and optimizer shards), no full model
    host_memory().reset_peak();
    const int64_t host_before = host_memory().live();
    pk.max(pk.rank_async_save, peak_of([&] {
             save_checkpoint(dir.path, "async_rank", a.model.get(), a.opt.get(), a.sched.get(),
                             nullptr, {.async_save = true});
             finalize_checkpoint();
           }));
    pk.max(pk.rank_host, host_memory().peak() - host_before);
    EXPECT_EQ(current_context().memory().live(), held);
    pk.max(pk.whole, peak_of([&] { const WholeParameters whole({a.model.get()}); }));
    a.step(2, shards_of(d, 4));
    const double next = a.eval_loss();
    for (const char* tag : {"sync", "async", "sync_rank", "async_rank"}) {
      Zero1Trainee b(1, sixteen_layers(9));
      pk.max(pk.load, peak_of([&] {
               load_checkpoint(dir.path, b.model.get(), b.opt.get(), b.sched.get(), {.tag = tag});
             }));
      nxd::testing::expect_same(model_values(*b.model), model, tag);
      nxd::testing::expect_same(shard_snapshot(*b.opt), state, tag);
      b.step(2, shards_of(d, 4));
      EXPECT_EQ(b.eval_loss(), next) << tag;
    }
  });
  auto ll = [](int64_t v) { return static_cast<long long>(v); };
  std::printf(
      "    16 layers, hidden 64, DP 4, f32: a rank holds %lld bytes; one unit gathered %lld bytes, "
      "the whole model %lld; device peak above what the rank holds: gathered save %lld, async "
      "%lld; per-rank save %lld, async %lld; load %lld bytes; async host snapshot: gathered "
      "(writer) %lld, per rank %lld bytes\n",
      ll(pk.resident), ll(pk.unit), ll(pk.whole), ll(pk.save), ll(pk.async_save), ll(pk.rank_save),
      ll(pk.rank_async_save), ll(pk.load), ll(pk.gathered_host), ll(pk.rank_host));
  EXPECT_GE(pk.whole, 16 * pk.unit);
  // one unit's full buffers and a few scalars (the step counts of the sync save's optimizer file)
  for (const int64_t p : {pk.save, pk.async_save, pk.load}) {
    EXPECT_GE(p, pk.unit);
    EXPECT_LE(p, pk.unit + 4096);
  }
  // per rank: no unit gathered, only the few scalars
  for (const int64_t p : {pk.rank_save, pk.rank_async_save}) EXPECT_LE(p, 4096);
  // the per-rank snapshot is about a quarter of the writer's gathered one (its block of the model
  // and its optimizer shards, which both hold)
  EXPECT_LT(pk.rank_host, pk.gathered_host - 16 * pk.unit / 2);
}

// The message of the nxd error f() throws.
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// At DP 4: f(a, b) with `a` trained one step and `b` the same model initialized otherwise.
void at_dp4(const std::function<void(Zero1Trainee&, Zero1Trainee&)>& f) {
  run_ranks(4, [&] {
    parallel_state::initialize_model_parallel(1);
    Zero1Trainee a(1, sixteen_layers()), b(1, sixteen_layers(9));
    a.step(0, shards_of(parallel_state::get_data_parallel_rank(), 4));
    f(a, b);
  });
}

// The user-visible property: a device that holds the sharded model and one unit more, but not the
// whole model gathered, saves and loads at stage 3 (WholeParameters there: OutOfDeviceMemory).
TEST(Zero3Checkpoint, SavesAndLoadsWhereTheWholeModelDoesNotFit) {
  const nxd::testing::ScratchDir dir("nxd_z3ckpt_fit_");
  at_dp4([&](Zero1Trainee& a, Zero1Trainee& b) {
    const auto model = model_values(*a.model);
    const int64_t unit = detail::UnitWalk({a.model.get()}).largest_unit_bytes();
    MemoryCounter& mem = current_context().memory();
    mem.set_capacity(mem.live() + unit + 4096);
    save_checkpoint(dir.path, "t", a.model.get(), a.opt.get(), a.sched.get());
    load_checkpoint(dir.path, b.model.get(), b.opt.get(), b.sched.get());
    EXPECT_THROW(const WholeParameters whole({a.model.get()}), OutOfDeviceMemory);
    a.zero1()->release_parameters();  // the units the failed constructor had gathered
    mem.set_capacity(0);
    nxd::testing::expect_same(model_values(*b.model), model, "loaded under the capacity");
  });
}

// One rank short of memory for a unit: the save and the load fail on every rank (none left waiting
// in a gather), that rank's OutOfDeviceMemory named; the save does not count and the load changes
// nothing. With the memory back both succeed.
TEST(Zero3Checkpoint, ARankThatCannotGatherAUnitFailsEveryRankAndChangesNothing) {
  const nxd::testing::ScratchDir dir("nxd_z3ckpt_oom_");
  at_dp4([&](Zero1Trainee& a, Zero1Trainee& b) {
    const bool short_rank = parallel_state::get_data_parallel_rank() == 2;
    MemoryCounter& mem = current_context().memory();
    const int64_t unit = detail::UnitWalk({b.model.get()}).largest_unit_bytes();
    const auto before = model_values(*b.model);
    const auto state = shard_snapshot(*b.opt);
    if (short_rank) mem.set_capacity(mem.live() + unit / 2);
    const std::string saved = message_of([&] {
      save_checkpoint(dir.path, "t", a.model.get(), a.opt.get(), a.sched.get(), nullptr,
                      {.zero3_files = Zero3ModelFiles::gathered});
    });
    EXPECT_NE(saved.find("out of device memory"), std::string::npos) << saved;
    if (!short_rank) {
      EXPECT_NE(saved.find("failed on rank 2"), std::string::npos) << saved;
    }
    EXPECT_FALSE(newest_checkpoint(dir.path).has_value());
    // the per-rank save gathers nothing: it succeeds under the same capacity
    save_checkpoint(dir.path, "t", a.model.get(), a.opt.get(), a.sched.get());
    EXPECT_TRUE(read_metadata(dir.path / "t")["parallel"].value("zero3", false));
    mem.set_capacity(0);
    if (short_rank) mem.set_capacity(mem.live() + unit / 2);
    const std::string loaded =
        message_of([&] { load_checkpoint(dir.path, b.model.get(), b.opt.get(), b.sched.get()); });
    EXPECT_NE(loaded.find("ZeRO-3 unit"), std::string::npos) << loaded;
    mem.set_capacity(0);
    nxd::testing::expect_same(model_values(*b.model), before, "after the refused load");
    nxd::testing::expect_same(shard_snapshot(*b.opt), state, "after the refused load");
    load_checkpoint(dir.path, b.model.get(), b.opt.get(), b.sched.get());
    nxd::testing::expect_same(model_values(*b.model), model_values(*a.model), "loaded");
  });
}

}  // namespace
}  // namespace nxd::ckpt

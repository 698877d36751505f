// ZeRO-3 checkpoints in per-rank blocks (format 3, docs/design/fsdp.md "Checkpoints"): every DP
// rank writes its block of each unit's flat parameter buffers (the root unit's included) with no
// gather; the checkpoint loads at stage 3 and stage 1 of its DP degree (the next step's loss
// bitwise), at another DP degree, on one rank without ZeRO, and at another TP degree (the weights
// and state bitwise); bf16 and async saves; nxd-ckpt's export reads it as the gathered format's;
// verify and load name a deleted, a truncated or an overlapping block file.
#include <gtest/gtest.h>

#include <fstream>
#include <mutex>

#include "nxd/checkpoint/dp_shards.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/layout.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/io/safetensors.h"
#include "nxd/layers/param_unit.h"
#include "support/files.h"
#include "support/ranks.h"
#include "zero1_util.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using nxd::testing::error_of;
using nxd::testing::full_state;
using nxd::testing::run_ranks;
using nxd::testing::shards_of;
using nxd::testing::Zero1Trainee;
using Values = std::map<std::string, Tensor>;

nxd::testing::TraineeOptions stage3(uint64_t seed = 1,
                                    optim::ZeroStage stage = optim::ZeroStage::three) {
  return {.zero1 = true,
          .seed = seed,
          .stage = stage,
          .bucket_bytes = 1 << 12,  // several buckets per unit: parameters cut between DP ranks
          .layers = 4,
          .hidden = 64,
          .root = true};
}

// Every model tensor, the units gathered for the copy.
Values model_values(const Module& m) {
  const WholeParameters whole({&m});
  return nxd::testing::snapshot(m, nullptr);
}

std::string block_file(int dp, int tp = 0) {
  return detail::shard_file(
      "model", {.dp_rank = dp, .tp_rank = tp, .files = detail::ShardFiles::zero3_blocks});
}

// What the DP 4 run saved: its full weights and optimizer state, and the loss after one more step.
struct Saved {
  std::mutex mu;
  Values model, state;
  double next = 0;
};

// DP 4 at stage 3 (the root a unit), two steps, saved under `tag` with `o`; one step more (while
// an async save is being written).
void save_dp4(const fs::path& dir, const std::string& tag, const SaveOptions& o, Saved& s) {
  run_ranks(4, [&] {
    parallel_state::initialize_model_parallel(1);
    const int d = parallel_state::get_data_parallel_rank();
    Zero1Trainee a(1, stage3());
    a.step(0, shards_of(d, 4));
    a.step(1, shards_of(d, 4));
    const Values model = model_values(*a.model), state = full_state(*a.opt);
    save_checkpoint(dir, tag, a.model.get(), a.opt.get(), a.sched.get(), nullptr, o);
    a.step(2, shards_of(d, 4));  // an async save's writer runs meanwhile, from its snapshot
    finalize_checkpoint();
    const double next = a.eval_loss();
    std::lock_guard<std::mutex> l(s.mu);
    if (d == 0) s.model = model, s.state = state, s.next = next;
  });
}

TEST(Zero3Files, EveryRankWritesItsBlocksAndTheyLoadAtAnyStageAndDpDegree) {
  const nxd::testing::ScratchDir dir("nxd_z3files_");
  Saved s;
  save_dp4(dir.path, "t", {}, s);
  const fs::path tag = dir.path / "t";
  const json m = read_metadata(tag);
  EXPECT_EQ(m["format_version"], 3);
  EXPECT_TRUE(m["parallel"].value("zero3", false));
  EXPECT_FALSE(fs::exists(tag / "model/dp_rank_00_tp_rank_00_pp_rank_00.safetensors"));
  for (int d = 0; d < 4; ++d) {
    ASSERT_TRUE(fs::exists(tag / block_file(d))) << d;
    EXPECT_TRUE(m["files"].contains(block_file(d))) << d;
    // a quarter of the units' weights each (and the tensors outside units on rank 0), no more
    io::SafetensorsReader r(tag / block_file(d));
    int64_t bytes = 0;
    for (const auto& t : r.header().tensors) bytes += t.nbytes();
    int64_t whole = 0;
    for (const auto& [n, t] : s.model) whole += t.nbytes();
    std::printf("    zero3 block file of DP rank %d: %lld of the model's %lld bytes\n", d,
                static_cast<long long>(bytes), static_cast<long long>(whole));
    EXPECT_LE(bytes, whole / 4 + 4096);
  }
  EXPECT_EQ(m["model"].size(), s.model.size());
  (void)verify_checkpoint(tag);
  // DP 4 at stages 3 and 1: the next step as the uninterrupted run's, bitwise
  for (const auto stage : {optim::ZeroStage::three, optim::ZeroStage::one}) {
    run_ranks(4, [&] {
      parallel_state::initialize_model_parallel(1);
      const int d = parallel_state::get_data_parallel_rank();
      Zero1Trainee b(1, stage3(9, stage));
      load_checkpoint(dir.path, b.model.get(), b.opt.get(), b.sched.get());
      nxd::testing::expect_same(model_values(*b.model), s.model, "DP 4 model");
      nxd::testing::expect_same(full_state(*b.opt), s.state, "DP 4 state");
      b.step(2, shards_of(d, 4));
      EXPECT_EQ(b.eval_loss(), s.next) << "stage " << static_cast<int>(stage);
    });
  }
  // DP 2 at stage 3 and one rank with AdamW: the weights and state as saved, bitwise
  run_ranks(2, [&] {
    parallel_state::initialize_model_parallel(1);
    Zero1Trainee b(1, stage3(9));
    load_checkpoint(dir.path, b.model.get(), b.opt.get(), b.sched.get());
    nxd::testing::expect_same(model_values(*b.model), s.model, "DP 2 model");
    nxd::testing::expect_same(full_state(*b.opt), s.state, "DP 2 state");
  });
  Zero1Trainee one(1, {.seed = 9, .layers = 4, .hidden = 64});
  load_checkpoint(dir.path, one.model.get(), one.opt.get(), one.sched.get());
  nxd::testing::expect_same(nxd::testing::snapshot(*one.model, nullptr), s.model, "one rank");
  nxd::testing::expect_same(full_state(*one.opt), s.state, "AdamW");
}

// bf16 (down-cast) and async saves in blocks load as the gathered format's do; the export of a
// block checkpoint is the gathered one's, bitwise.
TEST(Zero3Files, Bf16AndAsyncSavesAndTheExportMatchTheGatheredFormat) {
  const nxd::testing::ScratchDir dir("nxd_z3files_bf16_");
  Saved s;
  save_dp4(dir.path, "gathered", {.zero3_files = Zero3ModelFiles::gathered}, s);
  save_dp4(dir.path, "blocks", {.async_save = true}, s);
  save_dp4(dir.path, "gathered_bf16",
           {.down_cast_bf16 = true, .zero3_files = Zero3ModelFiles::gathered}, s);
  save_dp4(dir.path, "blocks_bf16", {.async_save = true, .down_cast_bf16 = true}, s);
  EXPECT_EQ(read_metadata(dir.path / "gathered")["format_version"], 2);
  EXPECT_EQ(read_metadata(dir.path / "blocks_bf16")["format_version"], 3);
  EXPECT_EQ(read_metadata(dir.path / "blocks_bf16")["model"]["lm_head.weight"]["dtype"], "BF16");
  for (const char* kind : {"", "_bf16"}) {
    const auto a = read_merged_model(dir.path / (std::string("gathered") + kind));
    const auto b = read_merged_model(dir.path / (std::string("blocks") + kind));
    nxd::testing::expect_same(Values(a.begin(), a.end()), Values(b.begin(), b.end()),
                              std::string("export") + kind);
    Zero1Trainee one(1, {.seed = 9, .layers = 4, .hidden = 64});
    load_checkpoint(dir.path, one.model.get(), nullptr, nullptr,
                    {.tag = std::string("blocks") + kind});
    Values want;
    for (const auto& [n, t] : a) want["m:" + n] = t.to(DType::f32);
    nxd::testing::expect_same(nxd::testing::snapshot(*one.model, nullptr), want, kind);
  }
}

// TP 2 x DP 2 at stage 3: the block files of each TP rank, loaded at TP 1 x DP 2 (the TP reshard)
// and TP 2 x DP 2, bitwise the gathered format's weights.
TEST(Zero3Files, Tp2Dp2BlocksReshardToTp1) {
  const nxd::testing::ScratchDir dir("nxd_z3files_tp_");
  run_ranks(4, [&] {
    parallel_state::initialize_model_parallel(2);
    const int d = parallel_state::get_data_parallel_rank();
    Zero1Trainee a(2, stage3());
    a.step(0, shards_of(d, 2));
    save_checkpoint(dir.path, "blocks", a.model.get(), a.opt.get(), a.sched.get());
    save_checkpoint(dir.path, "gathered", a.model.get(), a.opt.get(), a.sched.get(), nullptr,
                    {.zero3_files = Zero3ModelFiles::gathered});
  });
  for (int tp = 0; tp < 2; ++tp)
    for (int d = 0; d < 2; ++d) EXPECT_TRUE(fs::exists(dir.path / "blocks" / block_file(d, tp)));
  const auto g = read_merged_model(dir.path / "gathered");
  const auto b = read_merged_model(dir.path / "blocks");
  const Values whole(g.begin(), g.end());
  nxd::testing::expect_same(Values(b.begin(), b.end()), whole, "TP 2 export");
  for (const int tp : {1, 2})
    run_ranks(2 * tp, [&] {
      parallel_state::initialize_model_parallel(tp);
      Zero1Trainee c(tp, stage3(9));
      Zero1Trainee ref(tp, stage3(9));
      load_checkpoint(dir.path, c.model.get(), c.opt.get(), c.sched.get(), {.tag = "blocks"});
      load_checkpoint(dir.path, ref.model.get(), ref.opt.get(), ref.sched.get(),
                      {.tag = "gathered"});
      nxd::testing::expect_same(model_values(*c.model), model_values(*ref.model),
                                "TP " + std::to_string(tp));
      nxd::testing::expect_same(full_state(*c.opt), full_state(*ref.opt),
                                "TP " + std::to_string(tp) + " state");
    });
}

// A deleted, a truncated and an overlapping block file: verify (nxd-ckpt verify) and load both
// refuse the checkpoint, naming the file.
TEST(Zero3Files, VerifyAndLoadRefuseADeletedTruncatedOrOverlappingBlockFile) {
  const nxd::testing::ScratchDir dir("nxd_z3files_bad_");
  Saved s;
  save_dp4(dir.path, "t", {}, s);
  int n = 0;
  auto check = [&](const std::function<void(const fs::path&)>& damage,
                   const std::vector<std::string>& want) {
    const fs::path copy = dir.path / ("c" + std::to_string(n++));
    fs::create_directories(copy);
    fs::copy(dir.path / "t", copy / "t", fs::copy_options::recursive);
    damage(copy / "t");
    const std::string v = error_of([&] { verify_checkpoint(copy / "t"); });
    Zero1Trainee one(1, {.seed = 9, .layers = 4, .hidden = 64});
    const Values before = nxd::testing::snapshot(*one.model, nullptr);
    const std::string l =
        error_of([&] { load_checkpoint(copy, one.model.get(), one.opt.get(), nullptr); });
    for (const auto& w : want) {
      EXPECT_NE(v.find(w), std::string::npos) << "verify: '" << w << "' in: " << v;
      EXPECT_NE(l.find(w), std::string::npos) << "load: '" << w << "' in: " << l;
    }
    nxd::testing::expect_same(nxd::testing::snapshot(*one.model, nullptr), before, want.front());
    std::printf("    %s\n      verify: %s\n      load: %s\n", want.front().c_str(), v.c_str(),
                l.c_str());
  };
  const std::string f2 = block_file(2), f1 = block_file(1);
  check([&](const fs::path& d) { fs::remove(d / f2); }, {"missing shard", f2});
  check([&](const fs::path& d) { fs::resize_file(d / f1, fs::file_size(d / f1) - 40); },
        {"truncated", f1});
  // a block whose recorded range starts one element early: it overlaps DP rank 0's
  check(
      [&](const fs::path& d) {
        io::SafetensorsReader r(d / f1);
        auto meta = r.header().metadata;
        json ranges = json::parse(meta.at(detail::kZero1Key));
        for (auto& [name, v] : ranges.items())
          if (v["range"][0].get<int64_t>() > 0) {
            v["range"] = {v["range"][0].get<int64_t>() - 1, v["range"][1].get<int64_t>() - 1};
            break;
          }
        meta[detail::kZero1Key] = ranges.dump();
        const auto tensors = r.read_all();
        io::write_safetensors(d / f1, tensors, meta);
        json m = json::parse(nxd::testing::slurp(d / "metadata.json"));
        m["files"][f1]["bytes"] = fs::file_size(d / f1);
        std::ofstream(d / "metadata.json") << m.dump();
      },
      {"DP shards overlap"});
}

}  // namespace
}  // namespace nxd::ckpt

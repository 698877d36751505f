// save_checkpoint / load_checkpoint on one rank and on sim TP2 x DP2: bitwise round trips that
// resume training exactly, newest-complete selection and retention, and bad checkpoints that
// are refused with a named error while the target stays untouched.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ckpt_util.h"
#include "support/files.h"
#include "support/ranks.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using nxd::testing::error_of;
using nxd::testing::run_ranks;
using nxd::testing::Trainee;

// Trains 2 steps, saves, trains a 3rd; a fresh model (other seed, other schedule) loaded from
// the checkpoint equals the saved state bitwise and its 3rd step gives bitwise the same loss.
void round_trip(int tp, const fs::path& dir, const SaveOptions& so) {
  Trainee a(tp);
  a.step(0);
  a.step(1);
  const auto saved = nxd::testing::snapshot(*a.model, a.opt.get());
  save_checkpoint(dir, "step_2", a.model.get(), a.opt.get(), a.sched.get(),
                  json{{"step", 2}, {"note", "hi"}}, so);
  const double next = a.step(2);
  finalize_checkpoint();

  Trainee b(tp, /*seed=*/99, {.lr = 0.5});
  const json user = load_checkpoint(dir, b.model.get(), b.opt.get(), b.sched.get());
  EXPECT_EQ(user.at("step"), 2);
  EXPECT_EQ(user.at("note"), "hi");
  nxd::testing::expect_same(nxd::testing::snapshot(*b.model, b.opt.get()), saved, "loaded");
  EXPECT_EQ(b.opt->steps(), 2);
  EXPECT_EQ(b.sched->options().decay_steps, 10);
  EXPECT_EQ(b.sched->options().kind, optim::ScheduleKind::cosine);
  EXPECT_EQ(b.step(2), next) << "the resumed step's loss differs";
}

TEST(Checkpoint, RoundTripOneRank) {
  const nxd::testing::ScratchDir dir_scratch("nxd_ckpt_");
  const fs::path& dir = dir_scratch.path;
  round_trip(1, dir / "plain", {});
  round_trip(1, dir / "zstd", {.compress = true});
  round_trip(1, dir / "async", {.async_save = true});
  const json m = read_metadata(dir / "plain" / "step_2");
  EXPECT_EQ(m["format_version"], 1);  // no sharded optimizer state: readable by format-1 readers
  EXPECT_EQ(m["parallel"]["zero1"], false);
  EXPECT_EQ(m["step"], 2);
  EXPECT_EQ(m["parallel"]["tp"], 1);
  EXPECT_TRUE(m["model"].contains("model.layers.0.self_attn.q_proj.weight")) << m["model"].dump();
  EXPECT_TRUE(
      fs::exists(dir / "zstd/step_2/model/dp_rank_00_tp_rank_00_pp_rank_00.safetensors.zst"));
}

TEST(Checkpoint, RoundTripTp2Dp2) {
  const nxd::testing::ScratchDir dir_scratch("nxd_ckpt_");
  const fs::path& dir = dir_scratch.path;
  run_ranks(4, [&] {
    parallel_state::initialize_model_parallel(2);
    // the DP replicas see the same batches, so they stay identical without a gradient sync
    round_trip(2, dir / "plain", {});
    round_trip(2, dir / "async", {.async_save = true, .compress = true});
  });
  const json m = read_metadata(dir / "plain" / "step_2");
  EXPECT_EQ(m["parallel"]["tp"], 2);
  EXPECT_EQ(m["parallel"]["dp"], 2);
  // DP rank 0 of each TP rank wrote the model and optimizer; full shapes and splits recorded
  for (int tp = 0; tp < 2; ++tp) {
    const std::string s = "_tp_rank_0" + std::to_string(tp) + "_pp_rank_00.safetensors";
    EXPECT_TRUE(fs::exists(dir / ("plain/step_2/model/dp_rank_00" + s)));
    EXPECT_TRUE(fs::exists(dir / ("plain/step_2/optim/dp_rank_00" + s)));
    EXPECT_FALSE(fs::exists(dir / ("plain/step_2/model/dp_rank_01" + s)));
  }
  const auto& q = m["model"]["model.layers.0.self_attn.q_proj.weight"];
  EXPECT_EQ(q["shape"], json::array({32, 32}));
  EXPECT_EQ(q["split"]["parts"], 2);
}

// Async saves snapshot the tensors: training right after the call does not leak into the
// checkpoint, and the second save (which reuses the first one's snapshot buffers) is its own.
TEST(Checkpoint, AsyncSavesAreSnapshots) {
  const nxd::testing::ScratchDir dir_scratch("nxd_ckpt_");
  const fs::path& dir = dir_scratch.path;
  Trainee a(1);
  a.step(0);
  const auto s1 = nxd::testing::snapshot(*a.model, a.opt.get());
  const SaveStats st = save_checkpoint(dir, "s1", a.model.get(), a.opt.get(), nullptr, nullptr,
                                       {.async_save = true});
  EXPECT_GT(st.bytes, 0);
  a.step(1);
  const auto s2 = nxd::testing::snapshot(*a.model, a.opt.get());
  save_checkpoint(dir, "s2", a.model.get(), a.opt.get(), nullptr, nullptr, {.async_save = true});
  EXPECT_EQ(newest_checkpoint(dir), "s1");  // s2 completes at the next save or finalize
  a.step(2);
  finalize_checkpoint();
  EXPECT_EQ(newest_checkpoint(dir), "s2");
  for (const auto& [tag, want] : {std::pair{"s1", &s1}, std::pair{"s2", &s2}}) {
    Trainee b(1, 3);
    load_checkpoint(dir, b.model.get(), b.opt.get(), nullptr, {.tag = tag});
    nxd::testing::expect_same(nxd::testing::snapshot(*b.model, b.opt.get()), *want, tag);
  }
}

TEST(Checkpoint, NewestCompleteAndRetention) {
  const nxd::testing::ScratchDir dir_scratch("nxd_ckpt_");
  const fs::path& dir = dir_scratch.path;
  Trainee a(1);
  for (int s = 1; s <= 4; ++s) {
    a.step(s);
    save_checkpoint(dir, "step_" + std::to_string(s), a.model.get(), a.opt.get(), nullptr,
                    json{{"s", s}}, {.num_kept_ckpts = 2});
  }
  auto tags = list_checkpoints(dir);
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags[0].tag, "step_3");
  EXPECT_EQ(tags[1].tag, "step_4");
  EXPECT_EQ(newest_checkpoint(dir), "step_4");
  // a checkpoint without its done marker does not count
  fs::remove(dir / "step_4" / "done");
  EXPECT_EQ(newest_checkpoint(dir), "step_3");
  Trainee b(1, 5);
  EXPECT_EQ(load_checkpoint(dir, b.model.get(), b.opt.get(), nullptr).at("s"), 3);
  EXPECT_NE(error_of([&] {
              load_checkpoint(dir, b.model.get(), nullptr, nullptr, {.tag = "step_4"});
            }).find("no done marker"),
            std::string::npos);
  // newest is by save order, not by name: re-saving step_3 makes it the newest
  save_checkpoint(dir, "step_10", a.model.get(), nullptr, nullptr, json{{"s", 10}});
  std::ofstream(dir / "step_3/model/dp_rank_00_tp_rank_07_pp_rank_00.safetensors") << "stale";
  save_checkpoint(dir, "step_3", a.model.get(), nullptr, nullptr, json{{"s", 33}});
  EXPECT_EQ(newest_checkpoint(dir), "step_3");
  EXPECT_FALSE(fs::exists(dir / "step_3/model/dp_rank_00_tp_rank_07_pp_rank_00.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "step_3/optim/dp_rank_00_tp_rank_00_pp_rank_00.safetensors"))
      << "the re-save has no optimizer: the old state must not linger";
  // retention removes the incomplete step_4 left behind, and the oldest complete ones
  save_checkpoint(dir, "step_11", a.model.get(), nullptr, nullptr, nullptr, {.num_kept_ckpts = 1});
  tags = list_checkpoints(dir);
  ASSERT_EQ(tags.size(), 1u);
  EXPECT_EQ(tags[0].tag, "step_11");
  // folders that are not checkpoints are never touched
  fs::create_directories(dir / "notes");
  save_checkpoint(dir, "step_12", a.model.get(), nullptr, nullptr, nullptr, {.num_kept_ckpts = 1});
  EXPECT_TRUE(fs::exists(dir / "notes"));
  EXPECT_FALSE(fs::exists(dir / "step_11"));
  EXPECT_THROW(save_checkpoint(dir, "a/b", a.model.get(), nullptr, nullptr), InvalidArgument);
  EXPECT_NE(error_of([&] {
              load_checkpoint(dir / "nothing", b.model.get(), nullptr, nullptr);
            }).find("no complete checkpoint"),
            std::string::npos);
}

void flip_byte(const fs::path& p, int64_t from_end) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-from_end, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-from_end, std::ios::end);
  f.put(static_cast<char>(c ^ 0x04));
}

// Each bad checkpoint gives its named error and leaves the target model and optimizer as they were.
TEST(Checkpoint, BadCheckpointsAreRefusedAndLeaveTheTargetUntouched) {
  const nxd::testing::ScratchDir root_scratch("nxd_ckpt_");
  const fs::path& root = root_scratch.path;
  Trainee a(1);
  a.step(0);
  Trainee b(1, 7);
  const auto before = nxd::testing::snapshot(*b.model, b.opt.get());
  int n = 0;
  // a fresh copy of a good checkpoint, damaged by `damage`; expects `expect` in the error
  auto check = [&](const std::function<void(const fs::path&)>& damage, const std::string& expect,
                   const std::string& expect2 = "") {
    const fs::path dir = root / ("c" + std::to_string(n++));
    save_checkpoint(dir, "t", a.model.get(), a.opt.get(), a.sched.get());
    damage(dir / "t");
    const std::string m =
        error_of([&] { load_checkpoint(dir, b.model.get(), b.opt.get(), b.sched.get()); });
    EXPECT_NE(m.find(expect), std::string::npos) << "expected '" << expect << "' in: " << m;
    EXPECT_NE(m.find(expect2), std::string::npos) << "expected '" << expect2 << "' in: " << m;
    nxd::testing::expect_same(nxd::testing::snapshot(*b.model, b.opt.get()), before, expect);
  };
  const std::string model_file = "model/dp_rank_00_tp_rank_00_pp_rank_00.safetensors";
  const std::string optim_file = "optim/dp_rank_00_tp_rank_00_pp_rank_00.safetensors";
  // the last tensor of the model file is the output head (registration order)
  check([&](const fs::path& d) { flip_byte(d / model_file, 10); }, "checksum mismatch",
        "'lm_head.weight'");
  check([&](const fs::path& d) { flip_byte(d / optim_file, 100); }, "checksum mismatch",
        optim_file);
  check(
      [&](const fs::path& d) {
        fs::resize_file(d / model_file, fs::file_size(d / model_file) - 64);
      },
      "truncated", "'lm_head.weight'");
  check([&](const fs::path& d) { fs::remove(d / optim_file); }, "missing file", optim_file);
  check([&](const fs::path& d) { fs::remove(d / "scheduler.json"); }, "missing file",
        "scheduler.json");
  check(
      [&](const fs::path& d) {
        json m = json::parse(nxd::testing::slurp(d / "metadata.json"));
        m["format_version"] = kFormatVersion + 1;
        std::ofstream(d / "metadata.json") << m.dump();
      },
      "newer than this nxd", "metadata.json");
  check([&](const fs::path& d) { std::ofstream(d / "metadata.json") << "{\"format\":"; },
        "not valid JSON", "metadata.json");
  // another model: other sizes
  {
    const fs::path dir = root / "other";
    ModelConfig c = nxd::testing::ckpt_model_config(1);
    c.ffn_hidden_size = 64;
    auto other = make_causal_lm(c, 3);
    save_checkpoint(dir, "t", other.get(), nullptr, nullptr);
    const std::string m = error_of([&] { load_checkpoint(dir, b.model.get(), nullptr, nullptr); });
    EXPECT_NE(m.find("'model.layers.0.mlp.gate_proj.weight' has shape [64,32]"), std::string::npos)
        << m;
    EXPECT_NE(m.find("another model"), std::string::npos) << m;
    // another model: other names (one layer less), strict and not
    c = nxd::testing::ckpt_model_config(1);
    c.num_layers = 1;
    auto small = make_causal_lm(c, 3);
    save_checkpoint(dir, "u", small.get(), nullptr, nullptr);
    const std::string m2 =
        error_of([&] { load_checkpoint(dir, b.model.get(), nullptr, nullptr, {.tag = "u"}); });
    EXPECT_NE(m2.find("not in the checkpoint: 'model.layers.1."), std::string::npos) << m2;
    nxd::testing::expect_same(nxd::testing::snapshot(*b.model, b.opt.get()), before, "other");
    // an optimizer of another kind
    optim::SGD sgd(optim::default_param_groups({}, 0.1, 0.0));
    save_checkpoint(dir, "v", b.model.get(), &sgd, nullptr);
    const std::string m3 =
        error_of([&] { load_checkpoint(dir, b.model.get(), b.opt.get(), nullptr, {.tag = "v"}); });
    EXPECT_NE(m3.find("SGD"), std::string::npos) << m3;
    nxd::testing::expect_same(nxd::testing::snapshot(*b.model, b.opt.get()), before, "sgd");
    // strict=false loads what matches and leaves the rest
    load_checkpoint(dir, b.model.get(), nullptr, nullptr, {.tag = "u", .strict = false});
    EXPECT_TRUE(nxd::testing::bitwise_equal(
        b.model->get_parameter("model.layers.0.self_attn.q_proj.weight"),
        small->get_parameter("model.layers.0.self_attn.q_proj.weight")));
  }
}

// On TP2 x DP2 one rank's damaged shard fails the load on every rank, and no rank commits.
TEST(Checkpoint, OneBadShardFailsEveryRankAndNoneCommits) {
  const nxd::testing::ScratchDir dir_scratch("nxd_ckpt_");
  const fs::path& dir = dir_scratch.path;
  run_ranks(4, [&] {
    parallel_state::initialize_model_parallel(2);
    Trainee a(2);
    a.step(0);
    save_checkpoint(dir, "t", a.model.get(), a.opt.get(), nullptr);
    world().barrier();
    if (world().rank() == 0)
      flip_byte(dir / "t/model/dp_rank_00_tp_rank_01_pp_rank_00.safetensors", 10);
    world().barrier();
    Trainee b(2, 7);
    const auto before = nxd::testing::snapshot(*b.model, b.opt.get());
    const std::string m =
        error_of([&] { load_checkpoint(dir, b.model.get(), b.opt.get(), nullptr); });
    EXPECT_NE(m.find("checksum mismatch"), std::string::npos) << m;
    EXPECT_NE(m.find("tp_rank_01"), std::string::npos) << m;
    nxd::testing::expect_same(nxd::testing::snapshot(*b.model, b.opt.get()), before, "rank");
  });
}

}  // namespace
}  // namespace nxd::ckpt

// load_checkpoint and verify_checkpoint (nxd-ckpt verify) refuse the same damage (issue 25, case
// 5): swapped TP shard files (each records its nxd.tp_rank), a tensor without a checksum, NaN
// weights; verify also checks what metadata.json says of each shard (size, dtype, shape).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ckpt_util.h"
#include "nxd/checkpoint/offline.h"
#include "support/files.h"
#include "support/ranks.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
using nxd::testing::error_of;
using nxd::testing::run_ranks;
using nxd::testing::Trainee;

// A TP2 checkpoint under root/<name>/step_1 (after `damage` of the model's first weight).
fs::path tp2_checkpoint(const fs::path& root, const std::string& name,
                        const std::function<void(Trainee&)>& damage = {}) {
  run_ranks(2, [&] {
    parallel_state::initialize_model_parallel(2);
    Trainee t(2);
    t.step(0);
    if (damage) damage(t);
    save_checkpoint(root / name, "step_1", t.model.get(), t.opt.get(), t.sched.get());
  });
  return root / name / "step_1";
}

// What loading the checkpoint at TP2 throws ("no exception" when it loads).
std::string load_error(const fs::path& tag_dir) {
  std::string err = "no exception";
  run_ranks(2, [&] {
    parallel_state::initialize_model_parallel(2);
    Trainee t(2, 5);
    const std::string e = error_of(
        [&] { load_checkpoint(tag_dir.parent_path(), t.model.get(), t.opt.get(), nullptr); });
    if (current_context().rank() == 0) err = e;
  });
  return err;
}

#define EXPECT_HAS(msg, part) \
  EXPECT_NE((msg).find(part), std::string::npos) << "message: " << (msg) << "\nexpected: " << (part)

TEST(CheckpointIntegrity, SwappedTpShardsAreRefusedByLoadAndVerify) {
  const nxd::testing::ScratchDir s("nxd_integrity_");
  const fs::path tag = tp2_checkpoint(s.path, "swap");
  ASSERT_EQ(load_error(tag), "no exception");
  const fs::path a = tag / "model/dp_rank_00_tp_rank_00_pp_rank_00.safetensors",
                 b = tag / "model/dp_rank_00_tp_rank_01_pp_rank_00.safetensors";
  fs::rename(a, tag / "tmp");
  fs::rename(b, a);
  fs::rename(tag / "tmp", b);
  // on main both passed (the same sizes and tensor names) and resume trained on scrambled weights
  const std::string want = "records nxd.tp_rank=1 but its file name says 0";
  EXPECT_HAS(load_error(tag), want);
  EXPECT_HAS(error_of([&] { verify_checkpoint(tag); }), want);
}

TEST(CheckpointIntegrity, ATensorWithoutAChecksumIsRefusedByLoadAndVerify) {
  const nxd::testing::ScratchDir s("nxd_integrity_");
  const fs::path tag = tp2_checkpoint(s.path, "crc");
  const fs::path f = tag / "model/dp_rank_00_tp_rank_01_pp_rank_00.safetensors";
  std::string bytes = nxd::testing::slurp(f);
  const auto at = bytes.find("\"nxd.crc32c.");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 12, "\"nxd.zzzzzz.");  // the same length: only the entry's name changes
  std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_HAS(load_error(tag), "has no checksum (nxd.crc32c.");
  EXPECT_HAS(error_of([&] { verify_checkpoint(tag); }), "has no checksum (nxd.crc32c.");
}

TEST(CheckpointIntegrity, NonFiniteWeightsAreRefusedByLoadAndVerify) {
  const nxd::testing::ScratchDir s("nxd_integrity_");
  const fs::path tag = tp2_checkpoint(s.path, "nan", [](Trainee& t) {
    NoGradGuard g;
    t.model->state_dict().begin()->second.detach().fill_(NAN);
  });
  EXPECT_HAS(load_error(tag), "NaN or infinite value(s)");
  EXPECT_HAS(error_of([&] { verify_checkpoint(tag); }), "NaN or infinite value(s)");
}

// The JSON side files go through one list of checks in load and verify (integrity.h, issue 34):
// a user_content.json of another size than metadata.json records, and a scheduler.json whose
// schedule is garbage, were loaded (the scheduler's) or passed verify (both).
TEST(CheckpointIntegrity, SideFilesAreRefusedByLoadAndVerifyAlike) {
  const nxd::testing::ScratchDir s("nxd_integrity_");
  const fs::path tag = tp2_checkpoint(s.path, "side");
  auto load_all = [&] {
    std::string err = "no exception";
    run_ranks(2, [&] {
      parallel_state::initialize_model_parallel(2);
      Trainee t(2, 5);
      const std::string e = error_of(
          [&] { load_checkpoint(tag.parent_path(), t.model.get(), t.opt.get(), t.sched.get()); });
      if (current_context().rank() == 0) err = e;
    });
    return err;
  };
  ASSERT_EQ(load_all(), "no exception");
  const fs::path uc = tag / "user_content.json", sc = tag / "scheduler.json";
  const std::string uc_text = nxd::testing::slurp(uc);
  std::ofstream(uc, std::ios::app) << " ";  // still JSON, one byte more
  EXPECT_HAS(load_all(), "user_content.json has");
  EXPECT_HAS(load_all(), "bytes, metadata.json says");
  EXPECT_HAS(error_of([&] { verify_checkpoint(tag); }), "bytes, metadata.json says");
  std::ofstream(uc, std::ios::trunc) << uc_text;
  std::string text = nxd::testing::slurp(sc);
  const auto at = text.find("\"kind\": \"");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 9] = 'z';  // the same length: an unknown schedule kind
  std::ofstream(sc, std::ios::trunc) << text;
  EXPECT_HAS(load_all(), "scheduler.json");
  EXPECT_HAS(error_of([&] { verify_checkpoint(tag); }), "scheduler.json");
}

// Issue 34, case 15: the loader skipped checks verify makes (a shard's byte count in
// metadata.json; scheduler.json when no scheduler is restored) and neither checked
// user_content.json's trainer state (step 1e15 trained 0 steps and wrote step_1000000000000000).
TEST(CheckpointIntegrity, LoadMakesEveryCheckVerifyMakes) {
  const nxd::testing::ScratchDir s("nxd_integrity_");
  const fs::path tag = tp2_checkpoint(s.path, "same");
  const std::string good = nxd::testing::slurp(tag / "metadata.json");
  const std::string shard = "model/dp_rank_00_tp_rank_01_pp_rank_00.safetensors";
  nlohmann::json m = nlohmann::json::parse(good);
  m["files"][shard]["bytes"] = m["files"][shard]["bytes"].get<int64_t>() + 1;
  std::ofstream(tag / "metadata.json", std::ios::trunc) << m.dump(1);
  EXPECT_HAS(load_error(tag), "bytes, metadata.json says");
  EXPECT_HAS(error_of([&] { verify_checkpoint(tag); }), "bytes, metadata.json says");
  std::ofstream(tag / "metadata.json", std::ios::trunc) << good;
  ASSERT_EQ(load_error(tag), "no exception");
  // garbage of the same length in scheduler.json: refused though load restores no scheduler
  const fs::path sc = tag / "scheduler.json", uc = tag / "user_content.json";
  const std::string sc_text = nxd::testing::slurp(sc);
  std::ofstream(sc, std::ios::trunc) << std::string(sc_text.size(), 'x');
  EXPECT_HAS(load_error(tag), "scheduler.json is not valid JSON");
  EXPECT_HAS(error_of([&] { verify_checkpoint(tag); }), "scheduler.json is not valid JSON");
  std::ofstream(sc, std::ios::trunc) << sc_text;
  // a trainer step of 1e15 in user_content.json (its size recorded to match)
  auto user = [&](const nlohmann::json& trainer) {
    const std::string text = nlohmann::json{{"trainer", trainer}}.dump(2);
    std::ofstream(uc, std::ios::trunc) << text;
    nlohmann::json mm = nlohmann::json::parse(good);
    mm["files"]["user_content.json"]["bytes"] = text.size();
    std::ofstream(tag / "metadata.json", std::ios::trunc) << mm.dump(1);
  };
  const nlohmann::json loop = {{"step", 1000000000000000},
                               {"rng_seed", 7},
                               {"rng_counter", 0},
                               {"dp_size", 1},
                               {"data", nullptr}};
  user(loop);
  const std::string want = "user_content.json: trainer.step = 1000000000000000 is outside [0, ";
  EXPECT_HAS(load_error(tag), want);
  EXPECT_HAS(error_of([&] { verify_checkpoint(tag); }), want);
  nlohmann::json l2 = loop;
  l2["step"] = 3;
  l2["data"] = {{"epoch", 1e15}, {"position", 0}};
  user(l2);
  EXPECT_HAS(load_error(tag), "trainer.data.epoch = 1e+15 is not an integer");
  l2["data"] = {{"epoch", 0}, {"position", 2}};
  user(l2);
  EXPECT_EQ(load_error(tag), "no exception");
  EXPECT_GT(verify_checkpoint(tag).tensors, 0);
}

TEST(CheckpointIntegrity, VerifyChecksShardsAgainstMetadata) {
  const nxd::testing::ScratchDir s("nxd_integrity_");
  const fs::path tag = tp2_checkpoint(s.path, "meta");
  const std::string good = nxd::testing::slurp(tag / "metadata.json");
  auto edit = [&](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json m = nlohmann::json::parse(good);
    f(m);
    std::ofstream(tag / "metadata.json", std::ios::trunc) << m.dump(1);
  };
  const std::string shard = "model/dp_rank_00_tp_rank_01_pp_rank_00.safetensors";
  edit([&](nlohmann::json& m) { m["files"][shard]["bytes"] = 12; });
  EXPECT_HAS(error_of([&] { verify_checkpoint(tag); }), "bytes, metadata.json says 12");
  const std::string name = nlohmann::json::parse(good)["model"].begin().key();
  edit([&](nlohmann::json& m) { m["model"][name]["dtype"] = "F64"; });
  EXPECT_HAS(error_of([&] { verify_checkpoint(tag); }), "metadata.json says F64");
  EXPECT_NE(load_error(tag), "no exception");  // load refused it already
  edit([&](nlohmann::json& m) {
    auto& shape = m["model"][name]["shape"];
    shape[0] = shape[0].get<int64_t>() * 2;  // still splits evenly: only the shard disagrees
  });
  EXPECT_HAS(error_of([&] { verify_checkpoint(tag); }), "(whole), metadata.json says");
  EXPECT_NE(load_error(tag), "no exception");
  edit([](nlohmann::json&) {});
  EXPECT_GT(verify_checkpoint(tag).tensors, 0);
}

}  // namespace
}  // namespace nxd::ckpt

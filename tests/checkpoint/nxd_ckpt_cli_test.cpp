// nxd-ckpt end to end: inspect, verify (exit 1 naming the damaged tensor), export, reshard
// (ZeRO-1 state to another DP degree too), import / import-hf in the positional form
// (FILE OUT, HF_DIR OUT) and the earlier --out form, and exit code 2 for every user mistake.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include "ckpt_util.h"
#include "support/files.h"
#include "support/proc.h"
#include "support/ranks.h"
#include "zero1_util.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using nxd::testing::run_process;

nxd::testing::ProcResult ckpt(const std::vector<std::string>& args, const fs::path& dir) {
  std::vector<std::string> argv = {NXD_CKPT_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, dir, std::chrono::seconds(120));
}

TEST(NxdCkpt, InspectVerifyExportReshard) {
  const nxd::testing::ScratchDir d_scratch("nxd_ckpt_cli_");
  const fs::path& d = d_scratch.path;
  nxd::testing::Trainee t(1);
  t.step(0);
  save_checkpoint(d / "run", "step_1", t.model.get(), t.opt.get(), t.sched.get());
  save_checkpoint(d / "run", "step_2", t.model.get(), t.opt.get(), t.sched.get(), nullptr,
                  {.step = 2});
  fs::remove(d / "run/step_2/done");  // an interrupted save
  auto r = ckpt({"inspect", (d / "run").string()}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("step_1: complete, step 1, tp 1 pp 1 dp 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step_2: incomplete"), std::string::npos) << r.out;
  r = ckpt({"inspect", (d / "run/step_1").string(), "--tensors"}, d);
  EXPECT_NE(r.out.find("model model.layers.0.self_attn.k_proj.weight F32 [16,32] 2048 bytes"),
            std::string::npos)
      << r.out;
  r = ckpt({"verify", (d / "run").string()}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("step_1: ok"), std::string::npos) << r.out;
  r = ckpt({"export", (d / "run").string(), (d / "m.safetensors").string()}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(d / "m.safetensors"));
  r = ckpt({"import", (d / "m.safetensors").string(), (d / "imp").string(), "--tp", "2"}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(d / "imp/imported/model/dp_rank_00_tp_rank_01_pp_rank_00.safetensors"));
  r = ckpt({"export-hf", (d / "run").string(), (d / "hf").string()}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  // never overwritten (issue 25: into an existing file was exit 1): exit 2, the file unchanged
  const std::string exported = nxd::testing::slurp(d / "m.safetensors");
  for (const auto& [cmd, out, why] : std::vector<std::tuple<std::string, fs::path, std::string>>{
           {"export-hf", d / "m.safetensors", "is an existing file, not a folder"},
           {"export-hf", d / "hf", "hf/model.safetensors exists already"},
           {"export", d / "m.safetensors", "m.safetensors exists already"}}) {
    r = ckpt({cmd, (d / "run").string(), out.string()}, d);
    EXPECT_EQ(r.code, 2) << cmd << " " << out << ": " << r.err;
    EXPECT_NE(r.err.find(why), std::string::npos) << r.err;
  }
  EXPECT_EQ(nxd::testing::slurp(d / "m.safetensors"), exported);
  r = ckpt({"import-hf", (d / "hf").string(), (d / "hfin").string()}, d);  // the form
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(d / "hfin/imported/done"));
  EXPECT_EQ(read_metadata(d / "hfin/imported")["parallel"]["tp"], 1);
  r = ckpt({"import-hf", (d / "hf").string(), (d / "hfin").string(), "--tp", "2", "--tag", "tp2"},
           d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_metadata(d / "hfin/tp2")["parallel"]["tp"], 2);
  r = ckpt({"import-hf", (d / "hf").string(), "--tp", "2", "--out", (d / "hfout").string()}, d);
  EXPECT_EQ(r.code, 0) << r.err;  // the earlier form
  EXPECT_TRUE(fs::exists(d / "hfout/imported/done"));
  r = ckpt({"reshard", (d / "run").string(), "--tp", "2", "--out", (d / "tp2").string()}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(d / "tp2/step_1/model/dp_rank_00_tp_rank_01_pp_rank_00.safetensors"));
  // damage: exit 1 naming the tensor
  const fs::path f = d / "run/step_1/optim/dp_rank_00_tp_rank_00_pp_rank_00.safetensors";
  {
    std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
    s.seekp(-3, std::ios::end);
    s.put('\x55');
  }
  r = ckpt({"verify", (d / "run").string()}, d);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("checksum mismatch in tensor '"), std::string::npos) << r.err;
}

TEST(NxdCkpt, UserMistakesExitWithCode2) {
  const nxd::testing::ScratchDir d_scratch("nxd_ckpt_cli_");
  const fs::path& d = d_scratch.path;
  const std::string none = (d / "none").string();
  std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "usage: nxd-ckpt"},
      {{"frobnicate", none}, "unknown command 'frobnicate'"},
      {{"inspect", none}, "is not a folder"},
      {{"inspect", d.string()}, "no checkpoints under"},
      {{"verify", d.string()}, "no complete checkpoint"},
      {{"verify"}, "verify takes 1 argument(s), got 0"},
      {{"reshard", d.string(), "--tp", "0", "--out", none}, "--tp needs a positive integer"},
      {{"reshard", d.string(), "--out", none}, "needs --tp N"},
      {{"reshard", d.string(), "--tp", "2", "--pp", "2", "--out", none}, "no complete checkpoint"},
      {{"inspect", d.string(), "--bogus"}, "unknown option --bogus"},
      {{"import", none, "--tp", "1", "--out", none}, "is not a file"},
      {{"import", none, none}, "is not a file"},
      {{"import-hf", d.string(), "--tp", "1", "--out", none}, "has no config.json"},
      {{"import-hf", d.string(), none}, "has no config.json"},
      {{"import-hf", d.string()}, "import-hf takes HF_DIR OUT, got 1 argument(s)"},
      {{"import-hf", d.string(), none, "extra"}, "import-hf takes HF_DIR OUT, got 3 argument(s)"},
      {{"import-hf", d.string(), none, "--out", none}, "import-hf got OUT twice"},
      {{"import-hf", d.string(), none, "--tag", "a/b"}, "--tag must be a plain folder name"},
      {{"import-hf", d.string(), none, "--tp", "x"}, "--tp needs a positive integer, got 'x'"},
      {{"import-hf", d.string(), none, "--tag"}, "--tag needs a value"},
  };
  fs::create_directories(d / "noweights");  // a config.json, no weights
  std::ofstream(d / "noweights/config.json") << "{}";
  cases.push_back({{"import-hf", (d / "noweights").string(), none},
                   "has neither model.safetensors nor model.safetensors.index.json"});
  fs::create_directories(d / "hf");
  std::ofstream(d / "hf/config.json") << "{}";
  std::ofstream(d / "hf/model.safetensors") << "x";
  fs::create_directories(d / "taken/imported");
  cases.push_back({{"import-hf", (d / "hf").string(), (d / "taken").string()}, "already exists"});
  for (const auto& [args, expect] : cases) {
    const auto r = ckpt(args, d);
    EXPECT_EQ(r.code, 2) << expect << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
  }
}

// A ZeRO-1 checkpoint (DP 4): inspect says zero1, verify checks the DP files, reshard --dp 2
// writes two DP files whose state loads as the original's; a lost DP file fails verify.
TEST(NxdCkpt, Zero1InspectVerifyReshardDp) {
  const nxd::testing::ScratchDir d_scratch("nxd_ckpt_cli_");
  const fs::path& d = d_scratch.path;
  nxd::testing::run_ranks(4, [&] {
    parallel_state::initialize_model_parallel(1);
    nxd::testing::Zero1Trainee t(1, {.zero1 = true});
    t.step(0, nxd::testing::shards_of(parallel_state::get_data_parallel_rank(), 4));
    save_checkpoint(d / "run", "step_1", t.model.get(), t.opt.get(), t.sched.get());
  });
  auto r = ckpt({"inspect", (d / "run").string()}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("step 1, tp 1 pp 1 dp 4 zero1, format 2"), std::string::npos) << r.out;
  r = ckpt({"verify", (d / "run").string()}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  r = ckpt(
      {"reshard", (d / "run").string(), "--tp", "1", "--dp", "2", "--out", (d / "dp2").string()},
      d);
  ASSERT_EQ(r.code, 0) << r.err;
  const json m = read_metadata(d / "dp2/step_1");
  EXPECT_EQ(m["parallel"]["dp"], 2);
  EXPECT_EQ(m["parallel"]["zero1"], true);
  EXPECT_TRUE(fs::exists(d / "dp2/step_1/optim/dp_rank_01_tp_rank_00_pp_rank_00.safetensors"));
  EXPECT_FALSE(fs::exists(d / "dp2/step_1/optim/dp_rank_02_tp_rank_00_pp_rank_00.safetensors"));
  nxd::testing::Zero1Trainee a(1, {.seed = 3}), b(1, {.seed = 4});
  load_checkpoint(d / "run", a.model.get(), a.opt.get(), nullptr);
  load_checkpoint(d / "dp2", b.model.get(), b.opt.get(), nullptr);
  nxd::testing::expect_same(nxd::testing::snapshot(*b.model, b.opt.get()),
                            nxd::testing::snapshot(*a.model, a.opt.get()), "DP4 -> DP2");
  const std::string lost = "optim/dp_rank_02_tp_rank_00_pp_rank_00.safetensors";
  fs::remove(d / "run/step_1" / lost);
  r = ckpt({"verify", (d / "run").string()}, d);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find(lost), std::string::npos) << r.err;
}

}  // namespace
}  // namespace nxd::ckpt

// nxd-ckpt end to end: inspect, verify (exit 1 naming the damaged tensor), export, reshard, and
// exit code 2 for every user mistake.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ckpt_util.h"
#include "support/files.h"
#include "support/proc.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
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
  r = ckpt({"import", (d / "m.safetensors").string(), "--tp", "2", "--out", (d / "imp").string()},
           d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(d / "imp/imported/done"));
  r = ckpt({"export-hf", (d / "run").string(), (d / "hf").string()}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  r = ckpt({"import-hf", (d / "hf").string(), "--tp", "2", "--out", (d / "hfin").string()}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(d / "hfin/imported/done"));
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
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
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
      {{"import-hf", d.string(), "--tp", "1", "--out", none}, "has no config.json"},
  };
  for (const auto& [args, expect] : cases) {
    const auto r = ckpt(args, d);
    EXPECT_EQ(r.code, 2) << expect << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace nxd::ckpt

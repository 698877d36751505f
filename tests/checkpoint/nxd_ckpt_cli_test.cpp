// nxd-ckpt end to end: inspect, verify (exit 1 naming the damaged tensor), export, reshard
// (ZeRO-1 state to another DP degree too), import / import-hf in the positional form
// (FILE OUT, HF_DIR OUT) and the earlier --out form, and exit code 2 for every user mistake.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>

#include "ckpt_util.h"
#include "nxd/checkpoint/gguf_llama.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/io/safetensors.h"
#include "nxd/layers/models/causal_lm.h"
#include "support/files.h"
#include "support/proc.h"
#include "support/ranks.h"
#include "support/tiny_models.h"
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

// quantize DIR OUT --format: writes OUT/quantized.safetensors; inspect prints its format, verify
// passes, a flipped byte fails verify (exit 1 naming the tensor); an existing OUT, a missing or
// bad --format exit 2.
TEST(NxdCkpt, QuantizeInspectVerify) {
  const nxd::testing::ScratchDir d_scratch("nxd_ckpt_cli_");
  const fs::path& d = d_scratch.path;
  auto m = make_causal_lm(nxd::testing::quality_model("llama"), 3);
  save_checkpoint(d / "run", "step_1", m.get(), nullptr, nullptr);
  const std::string q = (d / "q").string(), file = (d / "q/quantized.safetensors").string();
  auto r = ckpt({"quantize", (d / "run").string(), q, "--format", "int4:64"}, d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(
      r.out.find("-> " + file + " (int4 (groups of 64, symmetric) weights in 28 linear layers"),
      std::string::npos)
      << r.out;
  r = ckpt({"inspect", q}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(file + ": quantized checkpoint (layout 1), int4 (groups of 64, symmetric) "
                              "weights in 28 linear layers"),
            std::string::npos)
      << r.out;
  r = ckpt({"inspect", q, "--tensors"}, d);
  EXPECT_NE(r.out.find("model.layers.0.mlp.down_proj.weight.scales F32 [128,4] 2048 bytes"),
            std::string::npos)
      << r.out;
  r = ckpt({"verify", q}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(file + ": ok, quantized int4 (groups of 64, symmetric), 28 layers"),
            std::string::npos)
      << r.out;
  {  // the output head too (layout 2)
    const std::string qh = (d / "qh").string();
    r = ckpt({"quantize", (d / "run").string(), qh, "--format", "int4:64:head"}, d);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("output head: int8, 0.13 MB -> 0.03 MB"), std::string::npos) << r.out;
    r = ckpt({"inspect", qh, "--tensors"}, d);
    EXPECT_NE(r.out.find("(layout 2), int4 (groups of 64, symmetric), head int8 weights"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("lm_head.weight.qweight I32 [256,32]"), std::string::npos) << r.out;
    r = ckpt({"verify", qh}, d);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find(": ok, quantized int4 (groups of 64, symmetric), head int8, 28 layers"),
              std::string::npos)
        << r.out;
  }
  for (const auto& [args, expect] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"quantize", (d / "run").string(), q, "--format", "int8"},
            q + " exists and is not an empty folder (not overwritten"},
           {{"quantize", (d / "run").string(), (d / "q2").string()}, "quantize needs --format"},
           {{"quantize", (d / "run").string(), (d / "q2").string(), "--format", "int4:16"},
            "--format: unknown weight format 'int4:16'"},
           {{"quantize", (d / "run").string(), (d / "q2").string(), "--format", "int8:head=q6"},
            "--format: unknown weight format 'int8:head=q6'"},
           {{"export", (d / "run").string(), (d / "x").string(), "--format", "int8"},
            "--format is an option of quantize"}}) {
    r = ckpt(args, d);
    EXPECT_EQ(r.code, 2) << expect << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(d / "q2"));
  {  // one flipped byte in a scale
    io::SafetensorsReader rd(file);
    const io::TensorInfo* t = rd.header().find("model.layers.1.self_attn.o_proj.weight.scales");
    ASSERT_NE(t, nullptr);
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(rd.header().data_start + t->begin + 2);
    f.put('\x11');
  }
  r = ckpt({"verify", q}, d);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("model.layers.1.self_attn.o_proj.weight.scales"), std::string::npos)
      << r.err;
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

// export-gguf / import-gguf: a Llama checkpoint to GGUF (q8_0) and back at TP 2 (verify passes,
// the weights are the q8_0-rounded ones); an existing OUT is never overwritten, a bad --type, a
// GPT-NeoX model and a damaged file exit 2.
TEST(NxdCkpt, ExportAndImportGguf) {
  const nxd::testing::ScratchDir d_scratch("nxd_ckpt_cli_");
  const fs::path& d = d_scratch.path;
  ModelConfig c = nxd::testing::tiny_model("llama");
  auto m = make_causal_lm(c, 3);
  save_checkpoint(d / "run", "step_1", m.get(), nullptr, nullptr);
  auto r =
      ckpt({"export-gguf", (d / "run").string(), (d / "m.gguf").string(), "--type", "q8_0"}, d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("(q8_0, 21 tensors"), std::string::npos) << r.out;
  r = ckpt({"import-gguf", (d / "m.gguf").string(), (d / "imp").string(), "--tp", "2"}, d);
  ASSERT_EQ(r.code, 0) << r.err;
  r = ckpt({"verify", (d / "imp").string()}, d);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  std::map<std::string, Tensor> got;
  for (auto& [n, t] : read_merged_model(d / "imp/imported")) got[n] = t;
  const auto want = read_gguf_model(d / "m.gguf").full;
  ASSERT_EQ(got.size(), want.size());
  for (auto& [n, t] : want) EXPECT_EQ(got.at(n).to_vector(), t.to_vector()) << n;
  std::ofstream(d / "taken.gguf") << "mine";
  auto neox = make_causal_lm(nxd::testing::tiny_model("gpt_neox"), 3);
  save_checkpoint(d / "neox", "step_1", neox.get(), nullptr, nullptr);
  std::ofstream(d / "cut.gguf") << "GGUF";
  for (const auto& [args, msg] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"export-gguf", (d / "run").string(), (d / "taken.gguf").string()}, "exists"},
           {{"export-gguf", (d / "run").string(), (d / "x.gguf").string(), "--type", "q4_K"},
            "unknown tensor type 'q4_K'"},
           {{"export-gguf", (d / "neox").string(), (d / "x.gguf").string()},
            "architecture 'gpt_neox'"},
           {{"export", (d / "run").string(), (d / "x.st").string(), "--type", "f16"},
            "--type and --tokenizer are options of export-gguf"},
           {{"import-gguf", (d / "cut.gguf").string(), (d / "imp2").string()}, "cut.gguf"}}) {
    r = ckpt(args, d);
    EXPECT_EQ(r.code, 2) << msg << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(msg), std::string::npos) << r.err;
  }
  std::ifstream in(d / "taken.gguf");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "mine");
}

// Mistakes in paths and NXD_* variables (issue 34): a malformed NXD_GEMM, an output under a file
// or with a component over 255 characters exit 2 naming them, not "internal error" (exit 1).
TEST(NxdCkpt, PathAndEnvironmentMistakesExitWithCode2) {
  const nxd::testing::ScratchDir d_scratch("nxd_ckpt_cli_");
  const fs::path& d = d_scratch.path;
  nxd::testing::Trainee t(1);
  save_checkpoint(d / "run", "step_1", t.model.get(), t.opt.get(), t.sched.get());
  std::ofstream(d / "file") << "x";
  auto r =
      run_process({"/usr/bin/env", "NXD_GEMM=mkl", NXD_CKPT_BIN, "inspect", (d / "run").string()},
                  d, std::chrono::seconds(120));
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("NXD_GEMM"), std::string::npos) << r.err;
  const std::string long_name(300, 'x');
  for (const fs::path& out : {d / "file" / "hf", d / long_name / "hf"}) {
    r = ckpt({"export-hf", (d / "run").string(), out.string()}, d);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("error:"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
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

// A ZeRO-3 checkpoint in per-rank blocks (DP 4, the root a unit): inspect prints zero3 and format
// 3, verify passes and exits 1 naming a deleted block file, export-hf writes the gathered
// format's tensors, and reshard to DP 2 loads as the original.
TEST(NxdCkpt, Zero3InspectVerifyExportHfReshard) {
  const nxd::testing::ScratchDir d_scratch("nxd_ckpt_cli_z3_");
  const fs::path& d = d_scratch.path;
  nxd::testing::run_ranks(4, [&] {
    parallel_state::initialize_model_parallel(1);
    nxd::testing::Zero1Trainee t(
        1,
        {.zero1 = true, .stage = optim::ZeroStage::three, .bucket_bytes = 1 << 12, .root = true});
    t.step(0, nxd::testing::shards_of(parallel_state::get_data_parallel_rank(), 4));
    save_checkpoint(d / "run", "step_1", t.model.get(), t.opt.get(), t.sched.get());
    save_checkpoint(d / "gathered", "step_1", t.model.get(), t.opt.get(), t.sched.get(), nullptr,
                    {.zero3_files = Zero3ModelFiles::gathered});
  });
  auto r = ckpt({"inspect", (d / "run").string()}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("step 1, tp 1 pp 1 dp 4 zero1 zero3, format 3"), std::string::npos) << r.out;
  r = ckpt({"verify", (d / "run").string()}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* src : {"run", "gathered"}) {
    r = ckpt({"export-hf", (d / src).string(), (d / (std::string("hf_") + src)).string()}, d);
    ASSERT_EQ(r.code, 0) << r.err;
  }
  auto tensors = [&](const char* src) {
    io::SafetensorsReader f(d / (std::string("hf_") + src) / "model.safetensors");
    const auto v = f.read_all();
    return std::map<std::string, Tensor>(v.begin(), v.end());
  };
  nxd::testing::expect_same(tensors("run"), tensors("gathered"), "export-hf");
  r = ckpt(
      {"reshard", (d / "run").string(), "--tp", "1", "--dp", "2", "--out", (d / "dp2").string()},
      d);
  ASSERT_EQ(r.code, 0) << r.err;
  nxd::testing::Zero1Trainee a(1, {.seed = 3}), b(1, {.seed = 4});
  load_checkpoint(d / "run", a.model.get(), a.opt.get(), nullptr);
  load_checkpoint(d / "dp2", b.model.get(), b.opt.get(), nullptr);
  nxd::testing::expect_same(nxd::testing::snapshot(*b.model, b.opt.get()),
                            nxd::testing::snapshot(*a.model, a.opt.get()), "DP4 zero3 -> DP2");
  const std::string lost = "model/zero3_dp_rank_02_tp_rank_00_pp_rank_00.safetensors";
  fs::remove(d / "run/step_1" / lost);
  r = ckpt({"verify", (d / "run").string()}, d);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find(lost), std::string::npos) << r.err;
}

// Rewrites one shard of a checkpoint with edit() applied to its tensors (metadata and checksums
// kept valid) and records its new size in metadata.json: damage that only the expert checks see.
void rewrite_shard(const fs::path& tag, const std::string& rel,
                   const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit,
                   const std::function<void(json&)>& edit_meta = nullptr) {
  io::SafetensorsReader r(tag / rel);
  const auto md = r.header().metadata;
  auto tensors = r.read_all();
  edit(tensors);
  io::write_safetensors(tag / rel, tensors, md);
  json m = json::parse(nxd::testing::slurp(tag / "metadata.json"));
  m["files"][rel] = {{"bytes", fs::file_size(tag / rel)}, {"tensors", tensors.size()}};
  if (edit_meta) edit_meta(m);
  std::ofstream(tag / "metadata.json") << m.dump(1);
}

// A Mixtral checkpoint saved at EP 2: inspect shows the experts per EP rank, verify passes, and
// reshard --ep 1 writes every expert into DP rank 0's file; verify exits 1 naming a missing
// expert shard (a tensor gone from its file, or gone from the file and metadata.json) and a
// duplicated one; impossible --ep values and an existing output are user mistakes (exit 2).
TEST(NxdCkpt, ExpertParallelInspectVerifyReshard) {
  const nxd::testing::ScratchDir d_scratch("nxd_ckpt_cli_");
  const fs::path& d = d_scratch.path;
  ModelConfig c = nxd::testing::micro_model("llama");
  c.arch = "mixtral";
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  c.moe.frequency = 1;
  nxd::testing::run_ranks(2, [&] {
    parallel_state::initialize_model_parallel({.expert = 2});
    auto m = make_causal_lm(c, 5);
    save_checkpoint(d / "run", "s", m.get(), nullptr, nullptr);
  });
  const std::string x1 = "model/dp_rank_01_tp_rank_00_pp_rank_00.safetensors";
  const std::string e3 = "model.layers.1.block_sparse_moe.experts.3.w2.weight";
  auto r = ckpt({"inspect", (d / "run").string(), "--tensors"}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("tp 1 pp 1 dp 2 ep 2, format 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("expert parallel 2: 2 per EP rank"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(e3 + " F32 [16,24] 1536 bytes dp_rank 1"), std::string::npos) << r.out;
  r = ckpt({"verify", (d / "run").string()}, d);
  EXPECT_EQ(r.code, 0) << r.err;
  r = ckpt({"reshard", (d / "run").string(), "--tp", "1", "--out", (d / "ep1").string()}, d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_metadata(d / "ep1/s").value("expert_parallel", 0), 1);
  EXPECT_FALSE(fs::exists(d / "ep1/s" / x1));
  io::SafetensorsReader one(d / "ep1/s/model/dp_rank_00_tp_rank_00_pp_rank_00.safetensors");
  EXPECT_NE(one.header().find(e3), nullptr);
  EXPECT_EQ(ckpt({"verify", (d / "ep1").string()}, d).code, 0);
  const std::string run = (d / "run").string(), out = (d / "out").string();
  for (const auto& [args, want] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"reshard", run, "--tp", "1", "--dp", "3", "--ep", "3", "--out", out},
            "num_experts=4 is not divisible by"},
           {{"reshard", run, "--tp", "1", "--ep", "2", "--out", out}, "ep=2 does not divide dp=1"},
           {{"reshard", run, "--tp", "1", "--ep", "0", "--out", out}, "--ep needs a positive"},
           {{"reshard", run, "--tp", "1", "--out", run}, "already exists"}}) {
    r = ckpt(args, d);
    EXPECT_EQ(r.code, 2) << want << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(d / "out/s"));
  // damage: copies of the checkpoint with one expert shard missing or duplicated
  auto damaged = [&](const std::string& name) {
    fs::create_directories(d / name);
    fs::copy(d / "run/s", d / name / "s", fs::copy_options::recursive);
    return d / name / "s";
  };
  auto drop_e3 = [&](std::vector<std::pair<std::string, Tensor>>& ts) {
    std::erase_if(ts, [&](const auto& t) { return t.first == e3; });
  };
  rewrite_shard(damaged("missing"), x1, drop_e3);
  rewrite_shard(damaged("unlisted"), x1, drop_e3, [&](json& m) { m["model"].erase(e3); });
  const std::string e0 = "model.layers.0.block_sparse_moe.experts.0.w1.weight";
  rewrite_shard(damaged("duplicated"), x1, [&](std::vector<std::pair<std::string, Tensor>>& ts) {
    for (auto& t :
         io::SafetensorsReader(d / "run/s/model/dp_rank_00_tp_rank_00_pp_rank_00.safetensors")
             .read_all())
      if (t.first == e0) ts.push_back(t);
  });
  for (const auto& [name, want] : std::vector<std::pair<std::string, std::string>>{
           {"missing", "tensor '" + e3 + "' is listed in metadata.json but not in"},
           {"unlisted", "has no expert 3 (model_config has 4 experts): a missing expert shard"},
           {"duplicated", "a duplicated expert shard"}}) {
    r = ckpt({"verify", (d / name).string()}, d);
    EXPECT_EQ(r.code, 1) << name << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << name << ": " << r.err;
    std::printf("    %s: %s", name.c_str(), r.err.c_str());
    if (name != "unlisted") {
      EXPECT_NE(r.err.find(x1), std::string::npos) << r.err;
    }
  }
}

}  // namespace
}  // namespace nxd::ckpt

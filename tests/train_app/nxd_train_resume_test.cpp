// Resume through nxd-train: a run stopped after step 4 (max_steps 5, checkpoints every 4 steps)
// and resumed with exp_manager.resume_from_checkpoint, or with resume_if_exists in the same
// exp_dir, writes bitwise the metrics (loss, lr, grad_norm) of an uninterrupted 8-step run for
// every later step; dropout is on, so the RNG counter matters. One rank and sim TP2 x DP2, with
// exp_manager.async_checkpointing (one rank, and ZeRO-1 at DP 4); built with NXD_RESUME_MPI
// (label mpi), TP2 x DP2 on 4 processes under mpirun (backend.kind=mpi).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "checkpoint/ckpt_util.h"
#include "support/files.h"
#include "support/proc.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
using nxd::testing::read_csv;
using nxd::testing::run_process;

fs::path write_config(const fs::path& d, int world, int tp, int pp) {
  { nxd::testing::tiny_corpus(d, 300); }
  const fs::path y = d / "tiny.yaml";
  std::ofstream(y) << "seed: 7\n"
                   << "trainer: {max_steps: 8, log_every_n_steps: 1, val_check_interval: 0, "
                      "num_threads: 1}\n"
                   << "data: {path: " << (d / "corpus.txt").string()
                   << ", seq_length: 32, micro_batch_size: 2, global_batch_size: 8}\n"
                   << "model: {num_layers: " << std::max(1, pp)
                   << ", hidden_size: 32, num_attention_heads: 2, "
                      "dropout: 0.1, optim: {lr: 1.0e-2, sched: {max_steps: 8}}}\n"
                   << "generation: {max_new_tokens: 0}\n"
                   << "backend: {world_size: " << world << "}\n"
                   << "distributed_strategy: {tensor_model_parallel_size: " << tp
                   << ", pipeline_model_parallel_size: " << pp << "}\n";
  return y;
}

struct ResumeCase {
  int world = 1, tp = 1;
  int np = 0;  // > 0: under mpirun with np processes (backend.kind=mpi)
  int pp = 1;
  std::vector<std::string> sets;  // more --set KEY=VALUE for every run
};

nxd::testing::ProcResult train(const fs::path& d, const std::vector<std::string>& args, int np,
                               const std::vector<std::string>& sets) {
  std::vector<std::string> argv;
#ifdef MPIEXEC
  if (np > 0) argv = {MPIEXEC, "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(np)};
#endif
  argv.insert(argv.end(), {NXD_TRAIN_BIN, "--config", (d / "tiny.yaml").string()});
  if (np > 0) argv.insert(argv.end(), {"--set", "backend.kind=mpi"});
  argv.insert(argv.end(), args.begin(), args.end());
  for (const auto& kv : sets) argv.insert(argv.end(), {"--set", kv});
  return run_process(argv, d, std::chrono::seconds(300));
}

// metrics.csv rows by step: loss, lr, grad_norm
std::map<std::string, std::vector<std::string>> rows(const fs::path& f) {
  std::map<std::string, std::vector<std::string>> m;
  for (const auto& r : read_csv(f).rows) m[r.at(0)] = {r.at(1), r.at(3), r.at(4)};
  return m;
}

void check_resume(const ResumeCase& c) {
  const nxd::testing::ScratchDir s("nxd_train_resume_");
  const fs::path& d = s.path;
  const int np = c.np;
  write_config(d, c.world, c.tp, c.pp);
  auto train = [&](const std::vector<std::string>& args, int procs) {
    return nxd::ckpt::train(d, args, procs, c.sets);
  };
  const bool async = std::find(c.sets.begin(), c.sets.end(),
                               "exp_manager.async_checkpointing=true") != c.sets.end();
  auto r = train({"--out", (d / "whole").string()}, np);
  ASSERT_EQ(r.code, 0) << r.err;
  r = train({"--set", "trainer.max_steps=5", "--set",
             "exp_manager.checkpoint_callback_params.every_n_train_steps=4", "--out",
             (d / "cut").string()},
            np);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(async ? "checkpoint step_4 (async): training stalled"
                             : "checkpoint step_4: training stalled"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(fs::exists(d / "cut/checkpoints/step_5/done"));  // save_last
  if (std::find(c.sets.begin(), c.sets.end(), "distributed_strategy.zero1=true") != c.sets.end())
    EXPECT_TRUE(fs::exists(  // every DP rank's part of the optimizer state
        d / "cut/checkpoints/step_4/optim/dp_rank_03_tp_rank_00_pp_rank_00.safetensors"));
  fs::copy(d / "cut", d / "again", fs::copy_options::recursive);
  r = train(
      {"--set", "exp_manager.resume_from_checkpoint=" + (d / "cut/checkpoints/step_4").string(),
       "--out", (d / "resumed").string()},
      0);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("at step 4"), std::string::npos) << r.out;
  r = train({"--set", "exp_manager.resume_if_exists=true", "--out", (d / "again").string()}, np);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("step_5 at step 5"), std::string::npos) << r.out;
  const auto whole = rows(d / "whole/metrics.csv"), cut = rows(d / "cut/metrics.csv"),
             resumed = rows(d / "resumed/metrics.csv"), again = rows(d / "again/metrics.csv");
  ASSERT_EQ(whole.size(), 8u);
  ASSERT_EQ(resumed.size(), 4u);
  ASSERT_EQ(again.size(), 3u);
  for (const auto* part : {&cut, &resumed, &again})
    for (const auto& [step, v] : *part) EXPECT_EQ(v, whole.at(step)) << "step " << step;
  // resume_from_checkpoint pointing nowhere is a user error (exit 2)
  r = train({"--set", "exp_manager.resume_from_checkpoint=" + (d / "nowhere").string(), "--out",
             (d / "bad").string()},
            np);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("no complete checkpoint under"), std::string::npos) << r.err;
}

#ifndef NXD_RESUME_MPI
TEST(NxdTrainResume, BitwiseLikeAnUninterruptedRunOneRank) {
  check_resume({.world = 1, .tp = 1});
}

TEST(NxdTrainResume, BitwiseLikeAnUninterruptedRunSimTp2Dp2) {
  check_resume({.world = 4, .tp = 2});
}

// Every stage's dropout counter is restored (stages draw different numbers of masks).
TEST(NxdTrainResume, BitwiseLikeAnUninterruptedRunSimTp2Pp2Dp2) {
  check_resume({.world = 8, .tp = 2, .pp = 2});
}

// Checkpoints written by the background writer resume as the synchronous ones: one rank, and
// ZeRO-1 at DP 4 (each DP rank's optimizer file written in the background).
TEST(NxdTrainResume, BitwiseWithAsyncCheckpointingOneRank) {
  check_resume({.world = 1, .tp = 1, .sets = {"exp_manager.async_checkpointing=true"}});
}

TEST(NxdTrainResume, BitwiseWithAsyncCheckpointingZero1Dp4) {
  check_resume(
      {.world = 4,
       .tp = 1,
       .sets = {"exp_manager.async_checkpointing=true", "distributed_strategy.zero1=true"}});
}
#else
TEST(NxdTrainResumeMpi, BitwiseLikeAnUninterruptedRunTp2Dp2OnFourProcesses) {
  check_resume({.world = 4, .tp = 2, .np = 4});
}
#endif

}  // namespace
}  // namespace nxd::ckpt

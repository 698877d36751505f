// nxd-elastic and resume at random moments: a rank (mpirun) or the sim job kill -9'd 5 times at
// seeded random moments, each run ending with every step once within 2% of the uninterrupted
// run; and the stall allowance, which follows the step time so a slow run is not taken for a hung
// one.
#include "elastic_job.h"

using namespace nxd::elastic;
using namespace nxd::testing::elastic;

namespace {

#ifndef NXD_ELASTIC_MPI
// The sim job (TP2 x DP2, four ranks in one process) kill -9'd at 5 seeded random moments (0 to
// 0.3 s after each launch's first metrics row (steps take 20-50 ms idle): mid-forward,
// mid-collective, mid-backward, mid-save of the checkpoint written every step, or between steps),
// each relaunch resuming its newest complete checkpoint as nxd-elastic's do; the pieces merged as
// nxd-elastic merges them have every step once, with the uninterrupted run's losses (within 2%;
// resume is bitwise).
TEST(NxdElasticSim, AJobKilledAtFiveRandomMomentsResumesWithEveryStepOnce) {
  Job t;
  const unsigned seed = kill_seed();
  std::mt19937 rng(seed);
  // 400 steps: a launch trains at most 0.3 s before its kill, ~60 steps at the 5 ms a step takes
  // on an idle Zen 4, so five kills can never find the job already finished (seen with 40 steps
  // at ~20 ms a step, and with 100 steps at ~8 ms: 26 + 22 + 22 + ... rows, the fifth launch done
  // before its kill)
  std::vector<std::string> sets = {"backend.world_size=4", "trainer.max_steps=400",
                                   "exp_manager.checkpoint_callback_params.every_n_train_steps=1"};
  std::string moments = "seed " + std::to_string(seed) + " (NXD_KILL_SEED to repeat):";
  const fs::path out = t.d / "out";
  std::set<pid_t> seen;
  ino_t last_inode = 0;
  for (int launch = 0; launch <= 5; ++launch) {
    std::vector<std::string> a = {NXD_TRAIN_BIN};
    for (auto& x : t.train_args(sets)) a.push_back(x);
    ProcResult r;
    std::thread run([&] { r = nxd::testing::run_process(a, t.d, std::chrono::seconds(120)); });
    if (launch < 5) {
      const auto live = wait_for_training(out, 1, seen, last_inode);
      const double delay = std::uniform_real_distribution<double>(0, 0.3)(rng);
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      const size_t rows = read_csv(out / "metrics.csv").rows.size();
      if (!live.empty()) ::kill(live.begin()->second, SIGKILL), seen.insert(live.begin()->second);
      moments += " kill " + std::to_string(launch + 1) + ": " + std::to_string(delay).substr(0, 5) +
                 " s after the launch's first row (" + std::to_string(rows) + " rows);";
    }
    run.join();
    if (launch < 5)
      ASSERT_EQ(r.code, -1) << moments << " launch " << launch + 1 << " was not killed\n" << r.err;
    else
      ASSERT_EQ(r.code, 0) << moments << "\n" << r.err;
    if (launch == 0) sets.push_back("exp_manager.resume_if_exists=true");
  }
  std::vector<fs::path> pieces;
  for (int k = 1; k <= 5; ++k) pieces.push_back(out / ("metrics." + std::to_string(k) + ".csv"));
  pieces.push_back(out / "metrics.csv");
  const MergeResult m = merge_metrics(pieces);
  ASSERT_TRUE(m.ok) << moments << " " << m.why;
  std::ofstream(out / "merged.csv") << m.text;
  std::vector<std::string> ref_sets(sets.begin(), sets.begin() + 2);  // no resume
  std::vector<std::string> ra = {NXD_TRAIN_BIN};
  for (auto& x : t.train_args(ref_sets, "ref")) ra.push_back(x);
  ASSERT_EQ(nxd::testing::run_process(ra, t.d).code, 0);
  const auto ref = read_csv(t.d / "ref/metrics.csv").rows;
  const auto got = read_csv(out / "merged.csv").rows;
  ASSERT_EQ(got.size(), ref.size()) << moments << "\n" << m.text;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(got[i][0], std::to_string(i + 1)) << moments;
    const double want = std::stod(ref[i][1]), loss = std::stod(got[i][1]);
    EXPECT_LE(std::fabs(loss - want), 0.02 * std::fabs(want))
        << moments << " step " << i + 1 << ": " << loss << " vs uninterrupted " << want;
  }
}

// A stand-in for mpirun (a shell script): the host probe (`... true`) succeeds; a launch writes
// `rows` metrics rows `gap` seconds apart into --out's metrics.csv (elapsed_s as nxd-train
// writes it), then ends (exit 0) or, with `hang`, stops writing for good.
fs::path fake_mpirun(const fs::path& dir, const std::string& name, double gap, int rows,
                     bool hang) {
  const fs::path p = dir / name;
  std::ofstream(p) << "#!/bin/sh\nout=; prev=\n"
                   << "for a in \"$@\"; do [ \"$prev\" = --out ] && out=$a; prev=$a; done\n"
                   << "case \" $* \" in *\" true \"*) exit 0;; esac\nmkdir -p \"$out\"\n"
                   << "echo step,loss,val_loss,lr,grad_norm,tokens_per_s,epoch,elapsed_s,"
                      "sim_step_s > \"$out/metrics.csv\"\n"
                   << "for s in $(seq 1 " << rows << "); do sleep " << gap
                   << "; echo $s,5.0,,0.1,1.0,10.0,0,$(awk \"BEGIN{print " << gap
                   << " * $s}\"), >> \"$out/metrics.csv\"; done\n"
                   << (hang ? "exec sleep 600\n" : "exit 0\n");
  fs::permissions(p, fs::perms::owner_all);
  return p;
}

// --stall-timeout is a floor: steps of 1.2 s under --stall-timeout 0.5 are a slow run, not a hang
// (the allowance is 4 x the slowest step so far), while a run that stops writing rows after its
// first (0.3 s) step is stopped (allowance max(0.5, 4 x 0.3) s) and counts as failed.
TEST(NxdElasticCli, TheStallAllowanceFollowsTheStepTime) {
  Job t;
  const auto slow = fake_mpirun(t.d, "slow-mpirun", 1.2, 3, false);
  ProcResult r = t.elastic({"--hosts", "localhost:4", "--mpirun", slow.string(), "--stall-timeout",
                            "0.5", "--max-restarts", "0"},
                           {});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("no new step"), std::string::npos) << r.err;
  const auto hung = fake_mpirun(t.d, "hung-mpirun", 0.3, 1, true);
  r = t.elastic({"--hosts", "localhost:4", "--mpirun", hung.string(), "--stall-timeout", "0.5",
                 "--max-restarts", "0"},
                {}, "out2");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("no new step for 1.2 s (--stall-timeout 0.5 s, slowest step so far 0.3 s)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(slurp(t.d / "out2/elastic.log").find("stalled"), std::string::npos);
}

#else  // under mpirun

// kill -9 of a random rank at 5 random moments of one run (TP2 x DP2, a checkpoint every step,
// --keep-failed-slots so each relaunch has 4 slots again): each moment is a seeded delay of 0 to
// 0.6 s after the launch's first metrics row, so kills land mid-forward, mid-collective,
// mid-backward, mid-save or between steps. The run ends with every step once and the losses of
// the uninterrupted run; on failure the seed and the moments are printed (NXD_KILL_SEED=<seed>
// repeats them, as closely as the machine's timing allows).
TEST(NxdElasticMpi, ARankKilledAtFiveRandomMomentsFinishesWithEveryStepOnce) {
  Job t;
  const unsigned seed = kill_seed();
  std::mt19937 rng(seed);
  // 50 steps and kills within 0.6 s of a launch's first row: a launch trains at most ~6 steps
  // (~0.1 s a step idle) before its kill, so the fifth kill cannot find the run finished (seen
  // with 20 steps and 1 s: launches of 8 steps, and the run done before the fifth kill)
  const std::vector<std::string> sets = {"trainer.max_steps=50",
                                         "exp_manager.checkpoint_callback_params.every_n_train_"
                                         "steps=1"};
  std::string moments = "seed " + std::to_string(seed) + " (NXD_KILL_SEED to repeat):";
  ProcResult r;
  std::thread run([&] {
    r = t.elastic(with(kMpi, {"--keep-failed-slots", "--max-restarts", "6"}), sets);
  });
  const fs::path out = t.d / "out", metrics = out / "metrics.csv";
  std::set<pid_t> seen;
  ino_t last_inode = 0;
  int kills = 0;
  while (kills < 5) {
    const auto ranks = wait_for_training(out, 4, seen, last_inode);
    if (ranks.empty()) break;
    const double delay = std::uniform_real_distribution<double>(0, 0.6)(rng);
    const int victim = static_cast<int>(rng() % 4);
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    for (auto& [k, pid] : ranks) seen.insert(pid);
    const size_t rows = read_csv(metrics).rows.size();
    ::kill(ranks.at(victim), SIGKILL);
    ++kills;
    moments += " kill " + std::to_string(kills) + ": rank " + std::to_string(victim) + " " +
               std::to_string(delay).substr(0, 5) + " s after the launch's first row (" +
               std::to_string(rows) + " rows);";
  }
  run.join();
  ASSERT_EQ(kills, 5) << moments << "\n" << r.err;
  ASSERT_EQ(r.code, 0) << moments << "\n" << r.err;
  const std::string log = slurp(out / "elastic.log");
  EXPECT_NE(log.find("restart 5:"), std::string::npos) << moments << "\n" << log;
  SCOPED_TRACE(moments);
  expect_every_step_once(t, reference(t, sets));
}

#endif

}  // namespace

// nxd-elastic: its decisions (hosts, layouts, what a failed mpirun names, the metrics merge), its
// user mistakes (exit 2), and, under mpirun (NXD_ELASTIC_MPI, label mpi), a rank killed, crashed
// or hung at several moments: every step ends up in metrics.csv once and the losses are the
// uninterrupted run's (sim TP2 x DP2, bitwise the same as mpirun's) within 2%.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <signal.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "elastic/plan.h"
#include "support/files.h"
#include "support/proc.h"

namespace fs = std::filesystem;
using namespace nxd::elastic;
using nxd::testing::ProcResult;
using nxd::testing::read_csv;
using nxd::testing::slurp;

namespace {

struct Job {
  fs::path d = nxd::testing::test_temp_dir("nxd_elastic_");
  Job() {
    nxd::testing::tiny_corpus(d, 300);
    std::ofstream(d / "tiny.yaml")
        << "seed: 7\n"
        << "trainer: {max_steps: 6, log_every_n_steps: 1, val_check_interval: 0, num_threads: 1}\n"
        << "data: {path: " << (d / "corpus.txt").string()
        << ", seq_length: 32, micro_batch_size: 2, global_batch_size: 8}\n"
        << "model: {num_layers: 1, hidden_size: 32, num_attention_heads: 2}\n"
        << "generation: {max_new_tokens: 0}\n"
        << "exp_manager: {create_tensorboard_logger: false, "
           "checkpoint_callback_params: {every_n_train_steps: 2}}\n"
        << "distributed_strategy: {tensor_model_parallel_size: 2, sequence_parallel: false}\n";
  }
  std::vector<std::string> train_args(const std::vector<std::string>& sets,
                                      const std::string& out = "out") const {
    std::vector<std::string> a = {"--config", (d / "tiny.yaml").string(), "--out",
                                  (d / out).string()};
    for (const auto& s : sets) a.insert(a.end(), {"--set", s});
    return a;
  }
  ProcResult elastic(const std::vector<std::string>& flags, const std::vector<std::string>& sets,
                     const std::string& out = "out") const {
    std::vector<std::string> a = {NXD_ELASTIC_BIN};
    a.insert(a.end(), flags.begin(), flags.end());
    a.push_back("--");
    for (auto& x : train_args(sets, out)) a.push_back(x);
    return nxd::testing::run_process(a, d, std::chrono::seconds(180));
  }
};

// The nxd-train ranks of one run (argv[0] nxd-train, --out `out`; mpirun's own command line
// names both too, so argv[0] decides), alive (not zombies), as world rank -> pid (sim: 0).
std::map<int, pid_t> live_ranks(const fs::path& out) {
  std::map<int, pid_t> ranks;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = slurp(e.path() / "cmdline");
    std::vector<std::string> argv;
    for (std::stringstream ss(cmd); std::getline(ss, cmd, '\0');) argv.push_back(cmd);
    if (argv.empty() || fs::path(argv[0]).filename() != "nxd-train") continue;
    if (std::find(argv.begin(), argv.end(), out.string()) == argv.end()) continue;
    const std::string stat = slurp(e.path() / "stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z') continue;
    std::string env = slurp(e.path() / "environ"), var;
    int rank = 0;  // sim: one process
    for (std::stringstream ss(env); std::getline(ss, var, '\0');)
      if (var.rfind("OMPI_COMM_WORLD_RANK=", 0) == 0) rank = std::stoi(var.substr(21));
    ranks[rank] = static_cast<pid_t>(std::stoi(name));
  }
  return ranks;
}

// A seed for the random moments: NXD_KILL_SEED if set (to repeat a failure), else a new one.
unsigned kill_seed() {
  const char* s = std::getenv("NXD_KILL_SEED");
  return s ? static_cast<unsigned>(std::stoul(s)) : static_cast<unsigned>(std::random_device{}());
}

// Waits (up to 120 s) until `ranks` processes of a run into `out` that were not seen before run
// and its metrics.csv is a new file (not `last_inode`) with a row: a launch that trains. Returns
// them (empty on timeout) and updates last_inode.
std::map<int, pid_t> wait_for_training(const fs::path& out, size_t ranks,
                                       const std::set<pid_t>& seen, ino_t& last_inode) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto live = live_ranks(out);
    if (live.size() != ranks) continue;
    bool fresh = true;
    for (auto& [k, pid] : live) fresh = fresh && !seen.count(pid);
    struct stat st {};
    if (!fresh || ::stat((out / "metrics.csv").c_str(), &st) != 0 || st.st_ino == last_inode ||
        read_csv(out / "metrics.csv").rows.empty())
      continue;
    last_inode = st.st_ino;
    return live;
  }
  return {};
}

#ifndef NXD_ELASTIC_MPI

TEST(NxdElasticPlan, HostsAndLayouts) {
  const auto h = parse_hosts("a:2,b:2,a:1,c");
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(host_arg(h), "a:3,b:2,c:1");
  EXPECT_EQ(total_slots(h), 6);
  EXPECT_EQ(host_of_rank(h, 3).value_or(""), "b");
  EXPECT_FALSE(host_of_rank(h, 6));
  const fs::path d = nxd::testing::test_temp_dir("nxd_elastic_");
  std::ofstream(d / "hosts") << "# two nodes\nn1 slots=4\nn2 slots=2 max_slots=8\n\nn3\n";
  EXPECT_EQ(host_arg(read_hostfile(d / "hosts")), "n1:4,n2:2,n3:1");
  std::ofstream(d / "bad") << "n1 slots=x\n";
  EXPECT_THROW(read_hostfile(d / "bad"), UsageError);
  EXPECT_THROW(parse_hosts("a:0"), UsageError);
  EXPECT_THROW(parse_hosts("a:2,,b"), UsageError);
  EXPECT_THROW(parse_hosts(":2"), UsageError);
  // TP2 x PP2, global batch 12, micro batch 2: 11 slots -> DP2 (DP 3 would need 12 ranks)
  auto l = choose_layout({.tp = 2, .pp = 2, .global_batch = 12, .micro_batch = 2}, 11);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->dp, 2);
  EXPECT_EQ(l->accumulation, 3);
  // DP must divide global / micro: 12 / 2 = 6 has no divisor 5 -> DP3 on 20 slots (DP5 fits)
  l = choose_layout({.tp = 2, .pp = 2, .global_batch = 12, .micro_batch = 2}, 20);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->dp, 3);
  EXPECT_EQ(l->accumulation, 2);
  // micro batch null: global / DP
  l = choose_layout({.tp = 2, .pp = 1, .global_batch = 8}, 8);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->dp, 4);
  EXPECT_EQ(l->micro_batch, 2);
  EXPECT_FALSE(choose_layout({.tp = 2, .pp = 2, .global_batch = 8}, 3));
  // a layout the whole configuration refuses is skipped (here: DP 4 and 3)
  l = choose_layout({.tp = 1, .pp = 1, .global_batch = 12, .micro_batch = 1}, 4,
                    [](const Layout& x) { return x.dp < 3; });
  ASSERT_TRUE(l);
  EXPECT_EQ(l->dp, 2);
  EXPECT_EQ(l->accumulation, 6);
}

// The lines Open MPI 4.1's mpirun writes when a rank dies by a signal, aborts, or exits non-zero.
TEST(NxdElasticPlan, ReadsTheFailedRanksFromMpirun) {
  auto f = parse_failure(
      "mpirun noticed that process rank 3 with PID 0 on node vm exited on signal 9 (Killed).\n");
  EXPECT_EQ(f.ranks, std::set<int>{3});
  EXPECT_EQ(f.nodes, std::set<std::string>{"vm"});
  f = parse_failure("MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\n");
  EXPECT_EQ(f.ranks, std::set<int>{1});
  f = parse_failure(
      "The first process to do so was:\n\n  Process name: [[6302,1],2]\n"
      "  Exit code:    1\n");
  EXPECT_EQ(f.ranks, std::set<int>{2});
  EXPECT_TRUE(parse_failure("nxd-train: error: something\n").ranks.empty());
  // a collective timeout: the ranks that never arrived, not the one that aborted
  f = parse_failure(
      "[mpi] collective timeout: rank 0 waited 2001 ms in all_reduce #7 on group [0,1,2,3] "
      "(collective_timeout 2 s): rank(s) 2,3 never arrived (no answer within 1000 ms: hung, "
      "stopped or cut off); rank(s) 1 wait in the same call; aborting the job\n"
      "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD\n"
      "  Process name: [[6302,1],0]\n  Node:  vm\n");
  EXPECT_EQ(f.ranks, (std::set<int>{2, 3}));
  EXPECT_TRUE(f.nodes.empty());
}

TEST(NxdElasticPlan, MergesMetricsKeepingTheLatestRowOfEachStep) {
  const fs::path d = nxd::testing::test_temp_dir("nxd_elastic_");
  const std::string h = "step,loss\n";
  std::ofstream(d / "a.csv") << h << "1,5.0\n2,4.0\n3,3.0\n4,2.9\n";  // died after 4, ckpt 2
  std::ofstream(d / "b.csv") << h;                                    // died before a step
  std::ofstream(d / "c.csv") << h << "3,3.1\n4,2.8\n5,2.7\n";         // died after 5, ckpt 4
  std::ofstream(d / "d.csv") << h << "5,2.6\n6,2.5\n";
  MergeResult m = merge_metrics({d / "a.csv", d / "b.csv", d / "c.csv", d / "d.csv"});
  ASSERT_TRUE(m.ok) << m.why;
  EXPECT_EQ(m.text, h + "1,5.0\n2,4.0\n3,3.1\n4,2.8\n5,2.6\n6,2.5\n");
  EXPECT_EQ(m.rows, 6);
  std::ofstream(d / "e.csv") << "step,loss,lr\n7,1,1\n";
  m = merge_metrics({d / "a.csv", d / "e.csv"});
  EXPECT_FALSE(m.ok);
  EXPECT_EQ(last_step(d / "c.csv"), 5);
  EXPECT_EQ(tag_step("step_12"), 12);
}

void expect_usage_error(const ProcResult& r, const std::string& part) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("nxd-elastic: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(part), std::string::npos) << r.err << "\nexpected: " << part;
}

TEST(NxdElasticCli, UserMistakesExit2) {
  Job t;
  expect_usage_error(nxd::testing::run_process({NXD_ELASTIC_BIN, "--hosts", "localhost:4"}, t.d),
                     "missing '--'");
  expect_usage_error(t.elastic({"--hosts", "localhost:0"}, {}), "slots must be a number");
  expect_usage_error(t.elastic({}, {}), "give one of --hosts and --hostfile");
  expect_usage_error(t.elastic({"--hosts", "localhost:1"}, {}), "the hosts give 1 slots");
  expect_usage_error(t.elastic({"--hosts", "localhost:4", "--max-restarts", "-1"}, {}),
                     "--max-restarts must be a number");
  expect_usage_error(t.elastic({"--hosts", "localhost:4"}, {"model.hiden_size=8"}),
                     "model.hiden_size");
  expect_usage_error(t.elastic({"--hostfile", (t.d / "none").string()}, {}), "--hostfile");
  // fault injection's kill mode would kill every sim rank at once: mpi only
  std::vector<std::string> a = {NXD_TRAIN_BIN};
  for (auto& x : t.train_args({"backend.fail_rank=1", "backend.fail_mode=kill"})) a.push_back(x);
  ProcResult k = nxd::testing::run_process(a, t.d);
  EXPECT_EQ(k.code, 2) << k.err;
  EXPECT_NE(k.err.find("backend.fail_mode=kill needs backend.kind=mpi"), std::string::npos)
      << k.err;
  // mpirun that cannot be started: nothing ran, nothing written
  const ProcResult r =
      t.elastic({"--hosts", "localhost:4", "--mpirun", (t.d / "no-mpirun").string()}, {});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("cannot start"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(t.d / "out"));
}

// The sim job (TP2 x DP2, four ranks in one process) kill -9'd at 5 seeded random moments (0 to
// 0.3 s after each launch's first metrics row (steps take ~50 ms idle): mid-forward,
// mid-collective, mid-backward, mid-save of the checkpoint written every step, or between steps),
// each relaunch resuming its newest complete checkpoint as nxd-elastic's do; the pieces merged as
// nxd-elastic merges them have every step once, with the uninterrupted run's losses (within 2%;
// resume is bitwise).
TEST(NxdElasticSim, AJobKilledAtFiveRandomMomentsResumesWithEveryStepOnce) {
  Job t;
  const unsigned seed = kill_seed();
  std::mt19937 rng(seed);
  std::vector<std::string> sets = {"backend.world_size=4", "trainer.max_steps=40",
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

const std::vector<std::string> kMpi = {"--hosts",       "localhost:4",
                                       "--mpirun",      MPIEXEC,
                                       "--mpirun-args", "--allow-run-as-root --oversubscribe"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The uninterrupted run's losses: sim TP2 x DP2 in one process (bitwise mpirun's).
std::vector<double> reference(const Job& t, std::vector<std::string> sets = {}) {
  std::vector<std::string> a = {NXD_TRAIN_BIN};
  sets.push_back("backend.world_size=4");
  for (auto& x : t.train_args(sets, "ref")) a.push_back(x);
  const ProcResult r = nxd::testing::run_process(a, t.d);
  EXPECT_EQ(r.code, 0) << r.err;
  std::vector<double> loss;
  for (const auto& row : read_csv(t.d / "ref/metrics.csv").rows) loss.push_back(std::stod(row[1]));
  return loss;
}

// metrics.csv holds steps 1..6 once each, losses within 2% of the reference.
void expect_every_step_once(const Job& t, const std::vector<double>& ref) {
  const auto csv = read_csv(t.d / "out/metrics.csv");
  ASSERT_EQ(csv.rows.size(), ref.size()) << slurp(t.d / "out/metrics.csv");
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(csv.rows[i][0], std::to_string(i + 1));
    const double loss = std::stod(csv.rows[i][1]);
    EXPECT_LE(std::fabs(loss - ref[i]), 0.02 * std::fabs(ref[i]))
        << "step " << i + 1 << ": " << loss << " vs uninterrupted " << ref[i];
  }
}

// A rank's process killed (SIGKILL) after step 3: its slot is dropped, the job goes on on 3
// slots as TP2 x DP1 with twice the accumulation, from step_2 resharded to DP1.
TEST(NxdElasticMpi, ARankKilledAfterStep3ResumesResharedToDp1) {
  Job t;
  const ProcResult r =
      t.elastic(kMpi, {"backend.fail_rank=1", "backend.fail_at_step=3", "backend.fail_mode=kill"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string log = slurp(t.d / "out/elastic.log");
  EXPECT_NE(log.find("rank 1's slot on localhost dropped"), std::string::npos) << log;
  EXPECT_NE(log.find("-> TP2 x PP1 x DP1 (world 2, micro batch 2 x 4 accumulation steps), "
                     "resuming at step 2"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("summary: done"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(t.d / "out/metrics.1.csv"));  // the first launch's rows, kept
  expect_every_step_once(t, reference(t));
}

// PP2 x DP2 with ZeRO-1: rank 3 (beyond the smaller world) throws after step 5 (MPI_Abort); the
// run resumes from step_4 as PP2 x DP1, the optimizer state resharded from DP2 to DP1; step 5's
// first row, if written, is replaced by the relaunch's.
TEST(NxdElasticMpi, ARankCrashingAfterStep5WithPp2AndZero1ResumesFromStep4) {
  Job t;
  const std::vector<std::string> layout = {"distributed_strategy.tensor_model_parallel_size=1",
                                           "distributed_strategy.pipeline_model_parallel_size=2",
                                           "model.num_layers=2", "distributed_strategy.zero1=true"};
  std::vector<std::string> sets = layout;
  for (const char* f : {"backend.fail_rank=3", "backend.fail_at_step=5", "backend.fail_mode=crash"})
    sets.push_back(f);
  const ProcResult r = t.elastic(kMpi, sets);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string log = slurp(t.d / "out/elastic.log");
  // Open MPI names the rank that called MPI_Abort in most runs, but on a loaded machine its
  // message is sometimes missing (seen about once in ten under ctest -j 2): nxd-elastic then
  // drops nothing and relaunches at the same size, still from step_4.
  if (log.find("failed ranks: not named") == std::string::npos) {
    EXPECT_NE(log.find("rank 3's slot on localhost dropped"), std::string::npos) << log;
    EXPECT_NE(log.find("-> TP1 x PP2 x DP1 (world 2, micro batch 2 x 4 accumulation steps), "
                       "resuming at step 4"),
              std::string::npos)
        << log;
  } else {
    EXPECT_NE(log.find("resuming at step 4"), std::string::npos) << log;
  }
  expect_every_step_once(t, reference(t, layout));
}

// A rank that stops answering after step 2 (before step_2 is saved; it sleeps 601 s): nothing
// names it, the stall watchdog stops the job, the relaunch (same size) trains from step 0. The
// allowance is max(3 s, 4 x the slowest step so far), so a machine slowed down by other builds
// (steps of 4 s at load average 160) does not stop the relaunch again and again.
TEST(NxdElasticMpi, AHungRankIsStoppedByTheStallTimeoutAndTheRunRestarts) {
  Job t;
  const ProcResult r =
      t.elastic(with(kMpi, {"--stall-timeout", "3"}),
                {"backend.fail_rank=2", "backend.fail_at_step=2", "backend.fail_mode=hang"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string log = slurp(t.d / "out/elastic.log");
  EXPECT_NE(log.find("stalled; failed ranks: not named; nothing dropped"), std::string::npos)
      << log;
  EXPECT_NE(log.find("from step 0 (no complete checkpoint)"), std::string::npos) << log;
  expect_every_step_once(t, reference(t));
}

// A rank that stops answering after step 3 under backend.collective_timeout_s=6 (no stall
// watchdog; 6 s, not 2: a rank computing or scheduled out that long under load would be named
// hung too, as it cannot answer the query outside MPI): the ranks waiting for it abort the job
// naming it, its slot is dropped, and the run goes on as TP2 x DP1 from step_2. Open MPI sometimes
// loses a rank's last line when the job is aborted (seen once, with the machine's load average at
// 160): nxd-elastic then names the rank that called MPI_Abort, drops its slot instead, and the run
// still ends as TP2 x DP1 from step_2.
TEST(NxdElasticMpi, AHungRankIsNamedByTheCollectiveTimeoutAndItsSlotDropped) {
  Job t;
  const ProcResult r =
      t.elastic(kMpi, {"backend.fail_rank=2", "backend.fail_at_step=3", "backend.fail_mode=hang",
                       "backend.collective_timeout_s=6"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string log = slurp(t.d / "out/elastic.log");
  if (log.find("failed ranks: 2;") != std::string::npos)
    EXPECT_NE(log.find("rank 2's slot on localhost dropped"), std::string::npos) << log;
  else
    EXPECT_NE(log.find("mpirun exit 1; failed ranks: "), std::string::npos) << log;
  EXPECT_NE(log.find("-> TP2 x PP1 x DP1 (world 2, micro batch 2 x 4 accumulation steps), "
                     "resuming at step 2"),
            std::string::npos)
      << log;
  expect_every_step_once(t, reference(t));
}

// Bounded: --max-restarts 0 gives up after the first failure (exit 1); another run's folder is
// refused by nxd-train (exit 2), not restarted, and left as it was.
TEST(NxdElasticMpi, GivesUpAfterMaxRestartsAndNeverTakesAnotherRunsFolder) {
  Job t;
  ProcResult r =
      t.elastic(with(kMpi, {"--max-restarts", "0"}),
                {"backend.fail_rank=0", "backend.fail_at_step=1", "backend.fail_mode=kill"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("giving up: 0 restarts used"), std::string::npos) << r.err;
  fs::create_directories(t.d / "other");
  std::ofstream(t.d / "other/metrics.csv") << "step,loss\n1,5.0\n";
  r = t.elastic(kMpi, {}, "other");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("holds another run's outputs"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not restarted"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(t.d / "other/metrics.csv"), "step,loss\n1,5.0\n");
}

// kill -9 of a random rank at 5 random moments of one run (TP2 x DP2, a checkpoint every step,
// --keep-failed-slots so each relaunch has 4 slots again): each moment is a seeded delay of 0 to
// 1 s after the launch's first metrics row, so kills land mid-forward, mid-collective,
// mid-backward, mid-save or between steps. The run ends with every step once and the losses of
// the uninterrupted run; on failure the seed and the moments are printed (NXD_KILL_SEED=<seed>
// repeats them, as closely as the machine's timing allows).
TEST(NxdElasticMpi, ARankKilledAtFiveRandomMomentsFinishesWithEveryStepOnce) {
  Job t;
  const unsigned seed = kill_seed();
  std::mt19937 rng(seed);
  const std::vector<std::string> sets = {"trainer.max_steps=20",
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
    const double delay = std::uniform_real_distribution<double>(0, 1.0)(rng);
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

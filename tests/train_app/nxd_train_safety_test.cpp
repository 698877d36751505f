// nxd-train never loses or silently corrupts a run's state (issue 25's cases, each reproduced):
// a second run into an --out holding another run is refused (or sets it aside), a running owner's
// lock is honoured and a dead one's taken over, a diverging run stops (or skips the step) and
// never checkpoints a non-finite step, and rerunning a finished job does not re-save its last
// checkpoint.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "checkpoint/ckpt_util.h"
#include "nxd/checkpoint/checkpoint.h"
#include "nxd/io/safetensors.h"
#include "support/files.h"
#include "support/proc.h"

namespace {
namespace fs = std::filesystem;
using nxd::testing::ProcResult;
using nxd::testing::read_csv;
using nxd::testing::slurp;

const std::string kCkpt = "exp_manager.checkpoint_callback_params.";

struct Dir {
  nxd::testing::ScratchDir s{"nxd_train_safety_"};
  fs::path d = s.path;
  Dir() {
    nxd::testing::tiny_corpus(d, 300);
    std::ofstream(d / "tiny.yaml")
        << "seed: 7\n"
        << "trainer: {max_steps: 4, log_every_n_steps: 1, val_check_interval: 0, num_threads: 1}\n"
        << "data: {path: " << (d / "corpus.txt").string()
        << ", seq_length: 32, micro_batch_size: 4, global_batch_size: 8}\n"
        << "model: {num_layers: 1, hidden_size: 32, num_attention_heads: 2}\n"
        << "generation: {max_new_tokens: 0}\n"
        << "exp_manager: {create_tensorboard_logger: false}\n"
        << "backend: {world_size: 1}\n"
        << "distributed_strategy: {tensor_model_parallel_size: 1, sequence_parallel: false}\n";
  }
  std::vector<std::string> launcher;  // e.g. mpirun -np 4 (then backend.kind=mpi)
  std::vector<std::string> argv(const std::vector<std::string>& sets,
                                const std::string& out) const {
    std::vector<std::string> a = launcher;
    a.insert(a.end(),
             {NXD_TRAIN_BIN, "--config", (d / "tiny.yaml").string(), "--out", (d / out).string()});
    if (!launcher.empty()) a.insert(a.end(), {"--set", "backend.kind=mpi"});
    for (auto& s : sets) a.insert(a.end(), {"--set", s});
    return a;
  }
  ProcResult train(std::vector<std::string> sets, const std::string& out = "out") const {
    return nxd::testing::run_process(argv(sets, out), d, std::chrono::seconds(120));
  }
};

[[maybe_unused]] std::set<std::string> tags(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& t : nxd::ckpt::list_checkpoints(dir)) out.insert(t.tag);
  return out;
}

[[maybe_unused]] void expect_user_error(const ProcResult& r, const std::string& part) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("nxd-train: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(part), std::string::npos) << r.err << "\nexpected: " << part;
}

#ifndef NXD_SAFETY_MPI
// Issue 25 (1): the second run deleted the first one's checkpoints and overwrote metrics.csv.
TEST(NxdTrainSafety, ASecondRunIntoAnotherRunsOutputIsRefusedOrSetsItAside) {
  Dir t;
  ProcResult r = t.train({kCkpt + "every_n_train_steps=4"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string metrics = slurp(t.d / "out/metrics.csv");
  r = t.train({"trainer.max_steps=3", kCkpt + "every_n_train_steps=1"});
  expect_user_error(r, "holds another run's outputs (metrics.csv, checkpoints/ (step_4))");
  EXPECT_NE(r.err.find("exp_manager.existing_run=set_aside"), std::string::npos) << r.err;
  EXPECT_EQ(tags(t.d / "out/checkpoints"), std::set<std::string>{"step_4"});
  EXPECT_EQ(slurp(t.d / "out/metrics.csv"), metrics);
  // told to: the earlier run moves to previous_runs/1/, whole
  r = t.train({"trainer.max_steps=3", kCkpt + "every_n_train_steps=1",
               "exp_manager.existing_run=set_aside"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("previous_runs/1"), std::string::npos) << r.out;
  EXPECT_EQ(slurp(t.d / "out/previous_runs/1/metrics.csv"), metrics);
  EXPECT_TRUE(fs::exists(t.d / "out/previous_runs/1/checkpoints/step_4/done"));
  EXPECT_EQ(tags(t.d / "out/checkpoints"), (std::set<std::string>{"step_2", "step_3"}));
  EXPECT_EQ(read_csv(t.d / "out/metrics.csv").rows.size(), 3u);
  EXPECT_FALSE(fs::exists(t.d / "out/nxd.lock"));  // released
  // a run that failed before its first step (metrics.csv with its header only) left no work
  fs::create_directories(t.d / "failed");
  std::ofstream(t.d / "failed/metrics.csv") << "step,loss,val_loss,lr,grad_norm\n";
  r = t.train({}, "failed");
  EXPECT_EQ(r.code, 0) << r.err;
}

// The quick start runs nxd-train without --out twice: the default folder runs/nxd_train is
// nxd-train's own scratch space, so exp_manager.existing_run=auto sets the earlier run aside
// there (nothing deleted) instead of refusing.
TEST(NxdTrainSafety, TheDefaultFolderSetsAnEarlierRunAsideSoTheQuickStartRunsTwice) {
  Dir t;
  const std::vector<std::string> a = {
      // in t.d, where runs/nxd_train is created
      "/bin/sh", "-c", "cd '" + t.d.string() + "' && exec '" NXD_TRAIN_BIN "' --config tiny.yaml"};
  ProcResult r = nxd::testing::run_process(a, t.d, std::chrono::seconds(120));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string metrics = slurp(t.d / "runs/nxd_train/metrics.csv");
  r = nxd::testing::run_process(a, t.d, std::chrono::seconds(120));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("previous_runs/1"), std::string::npos) << r.out;
  EXPECT_EQ(slurp(t.d / "runs/nxd_train/previous_runs/1/metrics.csv"), metrics);
  // a folder the user names is still refused
  r = t.train({}, "runs/nxd_train/previous_runs/1");
  expect_user_error(r, "holds another run's outputs");
}

// Issue 25 (3): rerunning a finished job re-saved its last checkpoint (done removed first). Now
// it is left as it is; a resumed run keeps the earlier metrics.csv as metrics.1.csv.
TEST(NxdTrainSafety, RerunningAFinishedJobKeepsItsLastCheckpointAndMetrics) {
  Dir t;
  ProcResult r = t.train({kCkpt + "every_n_train_steps=2"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string metrics = slurp(t.d / "out/metrics.csv");
  const auto before = fs::last_write_time(t.d / "out/checkpoints/step_4/done");
  r = t.train({kCkpt + "every_n_train_steps=2", "exp_manager.resume_if_exists=true"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("checkpoint step_4 already holds this state"), std::string::npos) << r.out;
  EXPECT_EQ(fs::last_write_time(t.d / "out/checkpoints/step_4/done"), before);
  EXPECT_EQ(slurp(t.d / "out/metrics.1.csv"), metrics);
}

// Issue 25 (4): nothing locked --out. A live owner (holding the flock) is named; a lock file left
// by a run that died is stale and taken over.
TEST(NxdTrainSafety, ALockedOutputDirIsRefusedNamingItsOwnerAndAStaleLockIsTakenOver) {
  Dir t;
  fs::create_directories(t.d / "out");
  const fs::path lock = t.d / "out/nxd.lock";
  std::ofstream(lock) << "pid 4242 host elsewhere started 2026-01-01T00:00:00Z\n";
  const int fd = open(lock.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  ProcResult r = t.train({});
  expect_user_error(r, "is in use by another run (pid 4242 host elsewhere");
  EXPECT_FALSE(fs::exists(t.d / "out/metrics.csv"));
  close(fd);  // the owner died: its file stays, unlocked
  r = t.train({});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("took over the stale lock"), std::string::npos) << r.out;
}

#endif

// Every tensor of a checkpoint's model shards is finite.
[[maybe_unused]] bool all_finite(const fs::path& tag_dir) {
  for (const auto& e : fs::directory_iterator(tag_dir / "model")) {
    nxd::io::SafetensorsReader rd(e.path());
    for (const auto& [name, t] : rd.read_all())
      for (double v : t.to_vector())
        if (!std::isfinite(v)) return false;
  }
  return true;
}

#ifndef NXD_SAFETY_MPI
// Issue 25 (2): losses 5.73 5.55 nan nan nan nan, the NaN checkpoints kept and the good ones
// deleted, exit 0. Now the run stops at the first non-finite step (exit 2, nothing saved from
// it); with on_nonfinite=skip it goes on without applying such steps, and every checkpoint kept
// is finite, also ranked by loss.
TEST(NxdTrainSafety, ADivergingRunStopsOrSkipsAndNeverCheckpointsANonFiniteStep) {
  Dir t;
  const std::vector<std::string> diverge = {"model.optim.lr=1e30", "model.optim.sched.min_lr=0",
                                            "trainer.max_steps=6", kCkpt + "every_n_train_steps=1"};
  ProcResult r = t.train(diverge, "stop");
  expect_user_error(r, "(not finite); the update was not applied");
  const auto rows = read_csv(t.d / "stop/metrics.csv").rows;
  ASSERT_GE(rows.size(), 1u);
  const std::string bad = rows.back().at(0);  // the step that stopped it is logged
  EXPECT_FALSE(std::isfinite(std::stod(rows.back().at(1))) &&
               std::isfinite(std::stod(rows.back().at(4))))
      << "loss " << rows.back().at(1) << ", grad_norm " << rows.back().at(4);
  EXPECT_NE(r.err.find("step " + bad + ": loss"), std::string::npos) << r.err;
  for (const auto& tag : tags(t.d / "stop/checkpoints")) {
    EXPECT_LT(std::stoi(tag.substr(5)), std::stoi(bad)) << tag;
    EXPECT_TRUE(all_finite(t.d / "stop/checkpoints" / tag)) << tag;
  }
  for (const char* monitor : {"step", "loss"}) {
    std::vector<std::string> s = diverge;
    s.insert(s.end(), {"trainer.on_nonfinite=skip", kCkpt + "monitor=" + monitor});
    const std::string out = std::string("skip_") + monitor;
    r = t.train(s, out);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("skipped (trainer.on_nonfinite=skip)"), std::string::npos) << r.out;
    const auto kept = tags(t.d / out / "checkpoints");
    EXPECT_EQ(kept.size(), 2u);
    for (const auto& tag : kept) EXPECT_TRUE(all_finite(t.d / out / "checkpoints" / tag)) << tag;
  }
}

#endif

// Starts nxd-train (stdout, stderr to files in d), sends `sig` once metrics.csv has `rows` rows,
// and returns its exit status (waitpid's).
int train_and_signal(const Dir& t, const std::vector<std::string>& sets, const std::string& out,
                     int sig, size_t rows) {
  std::vector<std::string> args = t.argv(sets, out);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, (t.d / (out + ".out")).c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, (t.d / (out + ".err")).c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  const fs::path csv = t.d / out / "metrics.csv";
  for (int i = 0; i < 60000; ++i) {  // up to 60 s
    std::error_code ec;
    if (fs::exists(csv, ec) && read_csv(csv).rows.size() >= rows) break;
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return st;  // ended by itself: the test fails
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (t.launcher.empty()) {
    kill(pid, sig);
  } else {  // every rank (mpirun's children), one by one, as a scheduler signals each process
    for (const auto& e : fs::directory_iterator("/proc")) {
      std::ifstream f(e.path() / "stat");
      std::string pid_s, comm, state;
      long ppid = 0;
      if (f >> pid_s >> comm >> state >> ppid && ppid == pid && comm == "(nxd-train)") {
        kill(static_cast<pid_t>(std::stol(pid_s)), sig);
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
      }
    }
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return st;
}

std::map<std::string, std::vector<std::string>> rows_by_step(const fs::path& csv) {
  std::map<std::string, std::vector<std::string>> m;
  for (const auto& r : read_csv(csv).rows) m[r.at(0)] = {r.at(1), r.at(3), r.at(4)};
  return m;
}

#ifndef NXD_SAFETY_MPI
// Issue 25 (8): SIGTERM lost up to every_n_train_steps of work. Now the run finishes its step,
// every rank (sim DP2) agrees on it, the checkpoint is written there and the exit code is 143;
// resuming from it gives bitwise the metrics of the uninterrupted run. SIGINT: 130.
TEST(NxdTrainSafety, SigtermCheckpointsTheCurrentStepAndResumesBitwise) {
  Dir t;
  const std::vector<std::string> sets = {"trainer.max_steps=300", "backend.world_size=2",
                                         "model.dropout=0.1"};
  ProcResult r = t.train(sets, "whole");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto whole = rows_by_step(t.d / "whole/metrics.csv");
  ASSERT_EQ(whole.size(), 300u);
  // checkpoints only at the end; or every step, async (the signal lands with a save pending)
  for (const std::vector<std::string>& ckpt :
       {std::vector<std::string>{kCkpt + "every_n_train_steps=1000"},
        std::vector<std::string>{kCkpt + "every_n_train_steps=1",
                                 "exp_manager.async_checkpointing=true"}}) {
    std::vector<std::string> s = sets;
    s.insert(s.end(), ckpt.begin(), ckpt.end());
    const std::string out = "cut" + std::to_string(ckpt.size());
    SCOPED_TRACE(out);
    const int st = train_and_signal(t, s, out, SIGTERM, 3);
    ASSERT_TRUE(WIFEXITED(st)) << "status " << st;
    EXPECT_EQ(WEXITSTATUS(st), 143);
    const std::string err = slurp(t.d / (out + ".err"));
    const auto at = err.find("preempted by SIGTERM after step ");
    ASSERT_NE(at, std::string::npos) << err;
    const std::string n = err.substr(at + 32, err.find(':', at + 32) - at - 32);
    ASSERT_LT(std::stoi(n), 300) << err;
    EXPECT_NE(err.find("checkpoints/step_" + n + " (resume with"), std::string::npos) << err;
    EXPECT_TRUE(fs::exists(t.d / out / ("checkpoints/step_" + n + "/done")));
    // resumed with checkpoints only at the end (how often it saves does not change the math)
    std::vector<std::string> again = sets;
    again.insert(again.end(),
                 {kCkpt + "every_n_train_steps=1000", "exp_manager.resume_if_exists=true"});
    r = t.train(again, out);
    ASSERT_EQ(r.code, 0) << r.err;
    const auto before = rows_by_step(t.d / out / "metrics.1.csv");
    const auto after = rows_by_step(t.d / out / "metrics.csv");
    EXPECT_EQ(before.size(), static_cast<size_t>(std::stoi(n)));
    EXPECT_EQ(after.size(), 300u - std::stoi(n));
    for (const auto* part : {&before, &after})
      for (const auto& [step, v] : *part) EXPECT_EQ(v, whole.at(step)) << "step " << step;
  }

  const int st2 = train_and_signal(t, {"trainer.max_steps=300"}, "int", SIGINT, 2);
  ASSERT_TRUE(WIFEXITED(st2)) << "status " << st2;
  EXPECT_EQ(WEXITSTATUS(st2), 130);
  EXPECT_NE(slurp(t.d / "int.err").find("preempted by SIGINT"), std::string::npos);
  EXPECT_EQ(tags(t.d / "int/checkpoints").size(), 1u);  // saved though checkpointing was off
}

// A second signal aborts at once: the process dies by it (no checkpoint, no exit code). The first
// one is sent mid-run, the second as soon as the run says it got the first; a model large enough
// that finishing the step and saving takes far longer than that (retried if it did not).
TEST(NxdTrainSafety, ASecondSignalAbortsAtOnce) {
  Dir t;
  const std::vector<std::string> sets = {"trainer.max_steps=3000", "model.hidden_size=256",
                                         "model.num_attention_heads=4", "data.seq_length=128",
                                         "model.num_layers=2"};
  int st = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string out = "twice" + std::to_string(attempt);
    std::vector<std::string> args = t.argv(sets, out);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const fs::path err = t.d / (out + ".err");
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = -1;
    ASSERT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    const fs::path csv = t.d / out / "metrics.csv";
    for (int i = 0; i < 60000; ++i) {  // a first row: training runs
      std::error_code ec;
      if (fs::exists(csv, ec) && !read_csv(csv).rows.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    kill(pid, SIGTERM);
    for (int i = 0; i < 60000 && slurp(err).find("signal received") == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    kill(pid, SIGTERM);
    waitpid(pid, &st, 0);
    if (WIFSIGNALED(st)) break;
  }
  ASSERT_TRUE(WIFSIGNALED(st)) << "status " << st;
  EXPECT_EQ(WTERMSIG(st), SIGTERM);
}

// Sim fault injection: rank 2 of 4 fails after step 5 of 8 (checkpoints every 2 steps). The job
// ends (exit 1) naming the rank; the newest complete checkpoint is step_4 and resuming from it
// trains bitwise the uninterrupted run. A hung rank (fail_mode=hang) is detected by
// backend.collective_timeout_s (2 s: a sim rank descheduled for 0.5 s on a loaded machine would
// be taken for a hung one): the others stop waiting and the error names the rank that never
// arrived.
TEST(NxdTrainSafety, AFailedOrHungSimRankEndsTheJobNamingItAndTheNewestCheckpointResumes) {
  Dir t;
  const std::vector<std::string> sets = {"trainer.max_steps=8", "backend.world_size=4",
                                         "data.micro_batch_size=2", "model.dropout=0.1",
                                         kCkpt + "every_n_train_steps=2"};
  ProcResult r = t.train(sets, "whole");
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> fail = sets;
  fail.insert(fail.end(), {"backend.fail_rank=2", "backend.fail_at_step=5"});
  r = t.train(fail, "cut");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("nxd-train: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("rank 2 failed after step 5"), std::string::npos) << r.err;
  EXPECT_EQ(nxd::ckpt::newest_checkpoint(t.d / "cut/checkpoints"),
            std::optional<std::string>("step_4"));
  std::vector<std::string> again = sets;
  again.push_back("exp_manager.resume_if_exists=true");
  r = t.train(again, "cut");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto whole = rows_by_step(t.d / "whole/metrics.csv");
  const auto after = rows_by_step(t.d / "cut/metrics.csv");
  ASSERT_EQ(after.size(), 4u);
  for (const auto& [step, v] : after) EXPECT_EQ(v, whole.at(step)) << "step " << step;

  fail.insert(fail.end(), {"backend.fail_mode=hang", "backend.collective_timeout_s=2"});
  r = t.train(fail, "hang");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("timed out after 2 s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 2: still running (never arrived)"), std::string::npos) << r.err;
  EXPECT_EQ(nxd::ckpt::newest_checkpoint(t.d / "hang/checkpoints"),
            std::optional<std::string>("step_4"));
}

#else
// Under mpirun (TP2 x DP2 on 4 processes): every rank gets SIGTERM at its own moment (3 ms apart,
// as a scheduler signals each process); the ranks agree on the step to stop after, that step is
// checkpointed, and resuming under mpirun gives bitwise the uninterrupted run's metrics.
TEST(NxdTrainSafetyMpi, SigtermUnderMpirunCheckpointsAnAgreedStepAndResumesBitwise) {
  Dir t;
  t.launcher = {MPIEXEC, "--allow-run-as-root", "--oversubscribe", "-np", "4"};
  const std::vector<std::string> sets = {
      "trainer.max_steps=300", "model.dropout=0.1", "backend.world_size=4",
      "distributed_strategy.tensor_model_parallel_size=2", kCkpt + "every_n_train_steps=1000"};
  ProcResult r = t.train(sets, "whole");
  ASSERT_EQ(r.code, 0) << r.err;
  const int st = train_and_signal(t, sets, "cut", SIGTERM, 3);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << "status " << st;  // ranks exited 143
  const auto tag = nxd::ckpt::newest_checkpoint(t.d / "cut/checkpoints");
  ASSERT_TRUE(tag.has_value()) << slurp(t.d / "cut.err");
  const std::string n = tag->substr(5);
  ASSERT_LT(std::stoi(n), 300);
  EXPECT_NE(slurp(t.d / "cut.err").find("preempted by SIGTERM after step " + n), std::string::npos)
      << slurp(t.d / "cut.err");
  std::vector<std::string> again = sets;
  again.push_back("exp_manager.resume_if_exists=true");
  r = t.train(again, "cut");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto whole = rows_by_step(t.d / "whole/metrics.csv");
  const auto after = rows_by_step(t.d / "cut/metrics.csv");
  EXPECT_EQ(after.size(), 300u - std::stoi(n));
  for (const auto& [step, v] : after) EXPECT_EQ(v, whole.at(step)) << "step " << step;
}
#endif

}  // namespace

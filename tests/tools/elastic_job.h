#pragma once
// What the nxd-elastic tests share: a tiny TP2 job (Job), the uninterrupted run's losses, the
// check that every step is in metrics.csv once, and finding and killing a run's ranks.
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

namespace nxd::testing::elastic {

namespace fs = std::filesystem;
using nxd::testing::ProcResult;
using nxd::testing::read_csv;
using nxd::testing::slurp;

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
inline std::map<int, pid_t> live_ranks(const fs::path& out) {
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
inline unsigned kill_seed() {
  const char* s = std::getenv("NXD_KILL_SEED");
  return s ? static_cast<unsigned>(std::stoul(s)) : static_cast<unsigned>(std::random_device{}());
}

// Waits (up to 120 s) until `ranks` processes of a run into `out` that were not seen before run
// and its metrics.csv is a new file (not `last_inode`) with a row: a launch that trains. Returns
// them (empty on timeout) and updates last_inode.
inline std::map<int, pid_t> wait_for_training(const fs::path& out, size_t ranks,
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

#ifdef NXD_ELASTIC_MPI

inline const std::vector<std::string> kMpi = {
    "--hosts", "localhost:4",   "--mpirun",
    MPIEXEC,   "--mpirun-args", "--allow-run-as-root --oversubscribe"};

inline std::vector<std::string> with(std::vector<std::string> a,
                                     const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The uninterrupted run's losses: sim TP2 x DP2 in one process (bitwise mpirun's).
inline std::vector<double> reference(const Job& t, std::vector<std::string> sets = {}) {
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
inline void expect_every_step_once(const Job& t, const std::vector<double>& ref) {
  const auto csv = read_csv(t.d / "out/metrics.csv");
  ASSERT_EQ(csv.rows.size(), ref.size()) << slurp(t.d / "out/metrics.csv");
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(csv.rows[i][0], std::to_string(i + 1));
    const double loss = std::stod(csv.rows[i][1]);
    EXPECT_LE(std::fabs(loss - ref[i]), 0.02 * std::fabs(ref[i]))
        << "step " << i + 1 << ": " << loss << " vs uninterrupted " << ref[i];
  }
}

#endif

}  // namespace nxd::testing::elastic

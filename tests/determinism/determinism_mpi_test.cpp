// Under mpirun, too: nxd-train at TP 2 x DP 2 on 4 processes twice gives bitwise the same losses,
// gradient norms and checkpoint files, and the sim backend's run of the same layout gives the
// same losses and norms (the same collective algorithms on another transport). ZeRO-2 at DP 2 on
// 2 processes gives the sim backend's ZeRO-1 losses and norms, and its checkpoint files, bitwise.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/files.h"
#include "support/proc.h"

namespace fs = std::filesystem;
using nxd::testing::ProcResult;

namespace {

// The TP 2 (SP) x ZeRO-1 layout of the first test.
const std::vector<std::string> kTp2Zero1 = {"distributed_strategy.tensor_model_parallel_size=2",
                                            "distributed_strategy.sequence_parallel=true",
                                            "distributed_strategy.zero1=true"};

std::vector<std::string> args(const fs::path& dir, const std::string& out,
                              const std::vector<std::string>& layout = kTp2Zero1) {
  std::vector<std::string> a;
  for (const std::string& s : layout) a.insert(a.end(), {"--set", s});
  for (std::string s :
       {"seed=7", "trainer.max_steps=12", "trainer.log_every_n_steps=1",
        "trainer.val_check_interval=0", "trainer.num_threads=1", "data.seq_length=32",
        "data.micro_batch_size=2", "data.global_batch_size=8", "model.num_layers=2",
        "model.hidden_size=32", "model.num_attention_heads=2", "model.optim.lr=1e-2",
        "generation.max_new_tokens=0", "exp_manager.create_checkpoint_callback=true",
        "exp_manager.checkpoint_callback_params.every_n_train_steps=12"})
    a.insert(a.end(), {"--set", s});
  a.insert(a.end(),
           {"--set", "data.path=" + (dir / "corpus.txt").string(), "--out", (dir / out).string()});
  return a;
}

ProcResult run(int np, std::vector<std::string> a, const fs::path& dir) {
  std::vector<std::string> argv;
  if (np > 0) argv = {MPIEXEC, "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(np)};
  argv.push_back(NXD_TRAIN_BIN);
  argv.insert(argv.end(), a.begin(), a.end());
  return nxd::testing::run_process(argv, dir);
}

}  // namespace

TEST(DeterminismMpi, RunsAreBitwiseAndTheSimBackendComputesTheSame) {
  auto d = nxd::testing::test_temp_dir("nxd_determinism_mpi_");
  nxd::testing::tiny_corpus(d, 300);
  std::vector<std::vector<std::vector<std::string>>> rows;
  for (const char* name : {"mpi_a", "mpi_b"}) {
    auto a = args(d, name);
    a.insert(a.end(), {"--set", "backend.kind=mpi"});
    ProcResult r = run(4, a, d);
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    rows.push_back(nxd::testing::read_csv(d / name / "metrics.csv").rows);
  }
  auto s = args(d, "sim");
  s.insert(s.end(), {"--set", "backend.world_size=4"});
  ProcResult rs = run(0, s, d);
  ASSERT_EQ(rs.code, 0) << rs.err;
  rows.push_back(nxd::testing::read_csv(d / "sim" / "metrics.csv").rows);
  ASSERT_EQ(rows[0].size(), 12u);
  for (size_t r = 1; r < rows.size(); ++r) {
    ASSERT_EQ(rows[r].size(), rows[0].size());
    for (size_t i = 0; i < rows[0].size(); ++i) {
      EXPECT_EQ(rows[r][i].at(1), rows[0][i].at(1))
          << (r == 1 ? "rerun" : "sim") << ": loss, step " << i + 1;
      EXPECT_EQ(rows[r][i].at(4), rows[0][i].at(4))
          << (r == 1 ? "rerun" : "sim") << ": grad norm, step " << i + 1;
    }
  }
  for (const auto& e : fs::recursive_directory_iterator(d / "mpi_a" / "checkpoints")) {
    if (!e.is_regular_file() || e.path().extension() != ".safetensors") continue;
    const fs::path rel = fs::relative(e.path(), d / "mpi_a");
    EXPECT_TRUE(nxd::testing::slurp(e.path()) == nxd::testing::slurp(d / "mpi_b" / rel))
        << rel << " differs between two mpirun runs";
    EXPECT_TRUE(nxd::testing::slurp(e.path()) == nxd::testing::slurp(d / "sim" / rel))
        << rel << " differs between mpirun and the sim backend";
  }
}

// ZeRO-2 (distributed_strategy.zero_stage=2) at DP 2 under mpirun: the sim backend's ZeRO-1 run,
// bitwise (losses, norms and every checkpoint file: the same buckets, collectives and layout).
TEST(DeterminismMpi, Zero2AtDp2IsTheSimBackendsZero1) {
  auto d = nxd::testing::test_temp_dir("nxd_zero2_mpi_");
  nxd::testing::tiny_corpus(d, 300);
  auto m = args(d, "mpi_zero2", {"distributed_strategy.zero_stage=2"});
  m.insert(m.end(), {"--set", "backend.kind=mpi"});
  ProcResult r = run(2, m, d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  auto s = args(d, "sim_zero1", {"distributed_strategy.zero_stage=1"});
  s.insert(s.end(), {"--set", "backend.world_size=2"});
  ProcResult rs = run(0, s, d);
  ASSERT_EQ(rs.code, 0) << rs.err;
  const auto a = nxd::testing::read_csv(d / "mpi_zero2" / "metrics.csv").rows;
  const auto b = nxd::testing::read_csv(d / "sim_zero1" / "metrics.csv").rows;
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].at(1), b[i].at(1)) << "loss, step " << i + 1;
    EXPECT_EQ(a[i].at(4), b[i].at(4)) << "grad norm, step " << i + 1;
  }
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(d / "mpi_zero2" / "checkpoints")) {
    if (!e.is_regular_file() || e.path().extension() != ".safetensors") continue;
    const fs::path rel = fs::relative(e.path(), d / "mpi_zero2");
    ++files;
    EXPECT_TRUE(nxd::testing::slurp(e.path()) == nxd::testing::slurp(d / "sim_zero1" / rel))
        << rel << " differs between mpirun ZeRO-2 and sim ZeRO-1";
  }
  EXPECT_GE(files, 3);  // the model and one optimizer file per DP rank
}

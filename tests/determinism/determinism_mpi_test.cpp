// Under mpirun, too: nxd-train at TP 2 x DP 2 on 4 processes twice gives bitwise the same losses,
// gradient norms and checkpoint files, and the sim backend's run of the same layout gives the
// same losses and norms (the same collective algorithms on another transport).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/files.h"
#include "support/proc.h"

namespace fs = std::filesystem;
using nxd::testing::ProcResult;

namespace {

std::vector<std::string> args(const fs::path& dir, const std::string& out) {
  std::vector<std::string> a;
  for (std::string s :
       {"seed=7", "trainer.max_steps=12", "trainer.log_every_n_steps=1",
        "trainer.val_check_interval=0", "trainer.num_threads=1", "data.seq_length=32",
        "data.micro_batch_size=2", "data.global_batch_size=8", "model.num_layers=2",
        "model.hidden_size=32", "model.num_attention_heads=2", "model.optim.lr=1e-2",
        "generation.max_new_tokens=0", "distributed_strategy.tensor_model_parallel_size=2",
        "distributed_strategy.sequence_parallel=true", "distributed_strategy.zero1=true",
        "exp_manager.create_checkpoint_callback=true",
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

// Whole training runs are bitwise deterministic: the same seed and configuration give the same
// losses, gradient norms and saved weights (every checkpoint file byte for byte) for any compute
// thread count and on a repeated run in the same process (other heap addresses), at one rank and
// in every parallel layout (TP with SP, PP, DP with ZeRO-1, CP, MoE with EP), at fp32 and at the
// default bf16 autocast. tools/test runs this binary on the native build and on the x86-64-v3
// (AVX2) and x86-64-v2 builds, so each instruction set's kernels are held to it.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "nxd/runtime/cpu_info.h"
#include "nxd/train_app/train.h"
#include "support/files.h"
#include "train_util.h"

using namespace nxd;
namespace fs = std::filesystem;

namespace {

struct TrainRun {
  std::vector<std::vector<std::string>> rows;  // metrics.csv: step, loss, val_loss, grad_norm, ...
  std::map<std::string, std::string> files;    // every checkpoint .safetensors file's bytes
};

TrainRun run(const fs::path& d, const std::string& name, std::vector<std::string> extra) {
  for (const char* s : {"model.num_layers=2", "exp_manager.create_checkpoint_callback=true",
                        "exp_manager.checkpoint_callback_params.every_n_train_steps=20"})
    extra.insert(extra.begin(), s);
  train_app::train(
      nxd::testing::tiny(d / name, nxd::testing::tiny_corpus(d), nxd::testing::parallel_run(extra)),
      {.quiet = true});
  TrainRun r;
  r.rows = nxd::testing::read_csv(d / name / "metrics.csv").rows;
  for (const auto& e : fs::recursive_directory_iterator(d / name / "checkpoints"))
    if (e.is_regular_file() && e.path().extension() == ".safetensors")
      r.files[fs::relative(e.path(), d / name).string()] = nxd::testing::slurp(e.path());
  return r;
}

// Losses and gradient norms as logged (%.9g) and every saved tensor file, byte for byte.
void expect_same(const TrainRun& a, const TrainRun& b, const std::string& what) {
  ASSERT_EQ(a.rows.size(), b.rows.size()) << what;
  ASSERT_EQ(a.rows.size(), 20u) << what;
  for (size_t i = 0; i < a.rows.size(); ++i) {
    EXPECT_EQ(a.rows[i].at(1), b.rows[i].at(1)) << what << ": loss at step " << i + 1;
    EXPECT_EQ(a.rows[i].at(4), b.rows[i].at(4)) << what << ": grad norm at step " << i + 1;
  }
  ASSERT_FALSE(a.files.empty()) << what << ": no checkpoint saved";
  ASSERT_EQ(a.files.size(), b.files.size()) << what;
  for (const auto& [path, bytes] : a.files) {
    auto it = b.files.find(path);
    ASSERT_NE(it, b.files.end()) << what << ": " << path << " missing";
    EXPECT_TRUE(it->second == bytes) << what << ": " << path << " differs";
  }
}

}  // namespace

TEST(Determinism, OneRankIsBitwiseOverThreadCountsAndRuns) {
  std::printf("    %s\n", cpu::describe().c_str());
  auto d = nxd::testing::test_temp_dir("nxd_determinism_");
  for (const char* precision : {"fp32", "bf16"}) {
    const std::string p = std::string("trainer.matmul_precision=") + precision;
    const TrainRun base = run(d, std::string(precision) + "_t1", {p, "trainer.num_threads=1"});
    int k = 0;
    for (int threads : {2, 4, 2}) {  // the second 2-thread run: a rerun at other addresses
      const std::string name =
          std::string(precision) + "_t" + std::to_string(threads) + "_" + std::to_string(k++);
      const TrainRun r = run(d, name, {p, "trainer.num_threads=" + std::to_string(threads)});
      expect_same(base, r, name);
    }
  }
}

TEST(Determinism, EveryParallelLayoutIsBitwiseOverRuns) {
  auto d = nxd::testing::test_temp_dir("nxd_determinism_layouts_");
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"tp2_sp",
       {"backend.world_size=2", "distributed_strategy.tensor_model_parallel_size=2",
        "distributed_strategy.sequence_parallel=true"}},
      {"pp2", {"backend.world_size=2", "distributed_strategy.pipeline_model_parallel_size=2"}},
      {"dp2_zero1", {"backend.world_size=2", "distributed_strategy.zero1=true"}},
      {"cp2", {"backend.world_size=2", "distributed_strategy.context_parallel_size=2"}},
      {"moe_ep2_dp2",
       {"backend.world_size=2", "model.moe.num_experts=4", "model.moe.top_k=2",
        "distributed_strategy.expert_model_parallel_size=2"}},
      {"tp2_bf16",
       {"backend.world_size=2", "distributed_strategy.tensor_model_parallel_size=2",
        "trainer.matmul_precision=bf16"}}};
  for (const auto& [name, keys] : layouts) {
    SCOPED_TRACE(name);
    const TrainRun a = run(d, name + "_a", keys);
    const TrainRun b = run(d, name + "_b", keys);
    expect_same(a, b, name);
  }
}

#pragma once
// Shared by the training-loop tests: a tiny corpus, a tiny nxd-train configuration over it, and
// metrics.csv rows.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nxd/runtime/error.h"
#include "nxd/train_app/config.h"
#include "nxd/train_app/train.h"
#include "support/files.h"

namespace nxd::testing {

// tiny_corpus(dir): support/files.h.

// One rank, 30 steps of a one-layer Llama on the corpus, then `extra` overrides.
inline train_app::TrainConfig tiny(const std::filesystem::path& out,
                                   const std::filesystem::path& corpus,
                                   std::vector<std::string> extra = {}) {
  train_app::Config c;
  for (std::string s :
       {"backend.world_size=1", "distributed_strategy.tensor_model_parallel_size=1",
        "distributed_strategy.sequence_parallel=false", "trainer.max_steps=30",
        "trainer.log_every_n_steps=5", "trainer.val_check_interval=10",
        "trainer.limit_val_batches=2", "trainer.num_threads=1", "data.seq_length=32",
        "data.micro_batch_size=8", "data.global_batch_size=8", "model.num_layers=1",
        "model.hidden_size=32", "model.num_attention_heads=2", "model.optim.lr=1e-2",
        "model.optim.sched.warmup_steps=3", "generation.max_new_tokens=20"})
    c.apply_override(s);
  c.apply_override("data.path=" + corpus.string());
  c.apply_override("exp_manager.exp_dir=" + out.string());
  for (auto& s : extra) c.apply_override(s);
  return train_app::resolve(c);
}

// The planner tests' run (tests/train_app/plan*_test.cpp): a 64-wide model, 3 steps of sequences
// of 32, no validation or sample; `shape` sets the layers, batch and world, `extra` the case.
inline train_app::TrainConfig plan_run(const std::filesystem::path& d, const std::string& name,
                                       std::vector<std::string> shape,
                                       const std::vector<std::string>& extra) {
  for (const char* s :
       {"model.hidden_size=64", "model.num_attention_heads=4", "data.seq_length=32",
        "data.micro_batch_size=2", "trainer.max_steps=3", "trainer.val_check_interval=0",
        "generation.max_new_tokens=0", "model.optim.sched.warmup_steps=1",
        "distributed_strategy.tensor_model_parallel_size=1"})
    shape.insert(shape.begin(), s);
  shape.insert(shape.end(), extra.begin(), extra.end());
  return tiny(d / name, tiny_corpus(d), shape);
}

struct Rows {
  std::vector<double> loss, grad_norm, sim_step;
  std::vector<std::string> val_loss;  // as written ("" when not validated)
};
inline Rows read_rows(const std::filesystem::path& csv) {
  Rows r;
  for (const auto& cols : read_csv(csv).rows) {
    r.loss.push_back(std::stod(cols.at(1)));
    r.val_loss.push_back(cols.at(2));
    r.grad_norm.push_back(std::stod(cols.at(4)));
    r.sim_step.push_back(cols.size() > 8 && !cols[8].empty() ? std::stod(cols[8]) : 0.0);
  }
  return r;
}

// One parameter per gradient bucket at every ZeRO stage (ZeRO-3's per-layer buckets are then
// ZeRO-1's: the same reductions, so the stages compare bitwise).
inline constexpr const char* kBucketPerParam = "distributed_strategy.grad_bucket_mb=0.000001";

// 20 steps of global batch 8 (micro 2), logged every step, no validation or sample. f32
// products: these tests check that the parallel run computes the single rank's math, which bf16
// inputs would blur (an ulp in an f32 partial sum can flip a bf16 rounding).
inline std::vector<std::string> parallel_run(std::vector<std::string> extra) {
  std::vector<std::string> s{"trainer.max_steps=20",         "trainer.log_every_n_steps=1",
                             "trainer.val_check_interval=0", "data.micro_batch_size=2",
                             "generation.max_new_tokens=0",  "trainer.gradient_clip_val=0.5",
                             "trainer.matmul_precision=fp32"};
  s.insert(s.end(), extra.begin(), extra.end());
  return s;
}

// The ConfigError message of resolving a parallel_run of tiny() with `extra` in d / "bad"; ""
// if it resolves.
inline std::string parallel_config_error(const std::filesystem::path& d,
                                         std::vector<std::string> extra) {
  try {
    tiny(d / "bad", tiny_corpus(d), parallel_run(std::move(extra)));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// A quiet parallel_run of tiny() with `layers` decoder layers in d / name: its result and rows.
struct TrainRun {
  train_app::TrainResult result;
  Rows rows;
};
inline TrainRun train_rows(const std::filesystem::path& d, const std::string& name,
                           std::vector<std::string> extra, int layers = 2) {
  extra.insert(extra.begin(), "model.num_layers=" + std::to_string(layers));
  TrainRun o;
  o.result = train_app::train(tiny(d / name, tiny_corpus(d), parallel_run(extra)), {.quiet = true});
  o.rows = read_rows(d / name / "metrics.csv");
  return o;
}

// train_rows of `layout` at ZeRO stage `stage` with one parameter per bucket (kBucketPerParam),
// in d / "stage<stage>_<tag>": the ZeRO tests' runs that compare the stages with each other.
inline TrainRun train_at_stage(const std::filesystem::path& d, std::vector<std::string> layout,
                               int stage, const std::string& tag, int layers) {
  layout.push_back(kBucketPerParam);
  layout.push_back("distributed_strategy.zero_stage=" + std::to_string(stage));
  return train_rows(d, "stage" + std::to_string(stage) + "_" + tag, std::move(layout), layers);
}

inline double mib(int64_t bytes) {
  return static_cast<double>(bytes) / 1048576.0;
}

// A resume test's runs at DP 4 over 8 steps with `setting` (e.g. a ZeRO key): the uninterrupted
// run ("whole") and a run cut at step 5 whose step-4 checkpoint is `ckpt`; args(extra) gives the
// DP 4 arguments for a resumed run.
struct CutRun {
  TrainRun whole;
  std::string ckpt;
  std::vector<std::string> dp4 = {"backend.world_size=4",
                                  "distributed_strategy.tensor_model_parallel_size=1",
                                  "trainer.max_steps=8", "model.optim.sched.max_steps=8"};
  std::vector<std::string> args(std::vector<std::string> extra) const {
    extra.insert(extra.begin(), dp4.begin(), dp4.end());
    return extra;
  }
};
inline CutRun cut_run(const std::filesystem::path& d, const std::string& setting) {
  CutRun c;
  c.whole = train_rows(d, "whole", c.args({setting}));
  train_rows(d, "cut",
             c.args({setting, "trainer.max_steps=5",
                     "exp_manager.checkpoint_callback_params.every_n_train_steps=4"}));
  c.ckpt = (d / "cut" / "checkpoints" / "step_4").string();
  return c;
}

}  // namespace nxd::testing

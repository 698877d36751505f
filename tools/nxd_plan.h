#pragma once
// nxd-plan's pieces shared by the command (nxd_plan.cpp: arguments, presets, one prediction)
// and its layout search (nxd_plan_search.cpp).
#include <string>
#include <vector>

#include "nxd/runtime/sim/machine.h"
#include "nxd/train_app/config.h"
#include "nxd/train_app/plan.h"

namespace nxd::plan_tool {

struct Args {
  std::vector<std::string> configs, sets;
  std::string model, instance = "trn1.32xlarge", timeline;
  int nodes = 1;
  bool search = false;
  int max_plans = 200;  // --search: the most plans it makes (its time bound)
  // --inference: the modeled latency of generation instead of a training step
  bool inference = false;
  int64_t batch = 1, prompt_tokens = 128, new_tokens = 128;
  int64_t max_context_tokens = 0;                  // --max-context-tokens; 0 = prompt + new tokens
  std::string prefill_attention = "materialized";  // --prefill-attention materialized|flash
  bool inference_sizes_given = false;  // --batch, --prompt-tokens or --new-tokens was given
  bool nodes_given = false;
};

// The configuration: nxd-train's defaults, random data (nothing is read), the preset, the files,
// the overrides, and the world of the nodes.
train_app::Config make_config(const Args& a, const sim::MachineSpec& m);

struct Prediction {
  train_app::TrainConfig cfg;
  train_app::MemoryPlan plan;
  const train_app::RankMemory* slowest = nullptr;
  double step = 0, seq_s = 0, tokens_s = 0, mfu = 0;
};

// The plan of cfg with its modeled step, and the throughput that follows.
Prediction predict(const train_app::TrainConfig& cfg, const sim::MachineSpec& m,
                   const std::string& timeline);

// "TP 8 x PP 4 x DP 8 x CP 2, EP 2, micro batch 1 (4 per step), ZeRO-1, checkpointing full"
std::string layout(const train_app::TrainConfig& c);

// --search: prints the fastest layouts that fit and why each won; returns the exit code (0: a
// layout fits, 3: none).
int search(const Args& a, const sim::MachineSpec& m);

// --inference: TTFT, TPOT and output tokens/s of the configured model at its
// tensor_model_parallel_size on one instance (layers/models/inference_model.h), heads, FFN and
// vocabulary padded for the TP degree; returns the exit code (0, or 3 when the weights and KV
// cache do not fit a NeuronCore's HBM).
int inference(const Args& a);

}  // namespace nxd::plan_tool

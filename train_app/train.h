#pragma once
// train_app/ (library nxd_train): the nxd-train application as a library, the top way to train
// (docs/MAP.md). It reads a YAML/JSON configuration (config.h: the key registry, the reader, the
// resolver into a TrainConfig), loads the data (corpus.h, tokenizer.h), builds the decoder-LM
// module (lm_module.h, init_from.h), checks the memory plan (plan.h), locks the run directory
// (run_dir.h) and runs a Trainer (trainer/) on the configured backend: train() here, and the
// command line with its exit codes in cli.h (run_cli, what tools/nxd_train.cpp calls).
//
// nxd-train's run: a resolved TrainConfig turned into a Trainer (trainer.h) with the built-in
// CausalLMModule (or a module of the caller's), its data, callbacks and loggers, on the backend
// the config names.
//
// Per step (per rank): lr = schedule(step - 1); for each of grad_accum_steps micro batches, loss =
// model->loss(ids, targets) and backward of loss / grad_accum_steps (so the gradient is that of
// the mean over the global batch); clip the global grad norm; optimizer step; zero the grads.
// Validation (every trainer.val_check_interval steps and at the last) is the mean loss over a
// fixed list of validation micro batches, in eval mode without a graph. The same config and seed
// give bitwise-identical losses (the thread count is part of the config).
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nxd/train_app/config.h"
#include "nxd/train_app/lm_module.h"
#include "nxd/trainer/trainer.h"

namespace nxd::train_app {

struct TrainOptions {
  std::FILE* out = stdout;  // progress and messages
  std::optional<bool> tty;  // progress bar in place; default: isatty(stdout)
  bool quiet = false;       // no terminal output at all
};

// The logging rank's FitResult (trainer.h; stop_reason "" = ran trainer.max_steps) and what the
// run adds. sim backend (world > 1): hbm_peak_bytes becomes the largest device-memory peak of
// any rank.
struct TrainResult : trainer::FitResult {
  std::string sample;                    // the generated text (bytes) or ids, "" when disabled
  double sim_seconds = 0;                // sim: the slowest rank's modeled total (setup included)
  std::vector<int64_t> rank_peak_bytes;  // sim: every rank's device-memory peak, by rank
  int64_t host_peak_bytes = 0;           // the logging rank's host-memory peak (optimizer offload)
};

// Builds the module of a run (default: CausalLMModule(cfg)); called on every rank.
using ModuleFactory = std::function<std::unique_ptr<CausalLMModule>(const TrainConfig&)>;

// The Trainer's options from the config (max_steps, accumulation, validation, clipping, layout,
// precision); callbacks and loggers are left to the caller.
trainer::TrainerOptions trainer_options(const TrainConfig& cfg);
// The NxDConfig the Trainer runs for this config (nxd_config_of(trainer_options(cfg))).
api::NxDConfig nxd_config_of(const TrainConfig& cfg);

// Trains as configured, writing cfg.out_dir/{config.yaml, metrics.csv, tensorboard/, sample.txt}.
// backend.kind=sim with world > 1: sim::launch of the world on backend.instance, each rank
// running the loop at TP x DP; backend.kind=mpi: the loop on this process's rank of the current
// (MPI) Context, whose world must have backend.world_size ranks. Each DP rank takes its micro
// batches of every global batch (DistributedSampler); the Trainer's NxDOptimizer reduces the
// gradients over DP in buckets (all-reduce, or ZeRO-1's reduce-scatter), sums SP gradients over
// TP and clips by the global norm. Only the lead rank prints and writes files; the loss reported
// is the global batch's mean (as on one rank).
TrainResult train(const TrainConfig& cfg, const TrainOptions& opts = {},
                  const ModuleFactory& make_module = {});

}  // namespace nxd::train_app

#pragma once
// What nxd-train prints and writes about a run on its logging rank (internal to train_app/):
// the summary once setup is done (data, model, layout, schedule, precision), the result line
// after fit, and the text sample generated from the trained model.
#include <cstdio>
#include <memory>
#include <string>

#include "nxd/train_app/train.h"

namespace nxd::train_app {

// A callback that prints the run's summary at fit start and the validation losses of an
// evaluation run (trainer.max_steps=0) or of step 0.
std::shared_ptr<trainer::Callback> make_run_summary(const TrainConfig& cfg, const TrainData& data);

// The lines after fit: steps, time, tokens/s, loss, the modeled step, memory, the pipeline
// bubble, optimizer offload's host memory and SFT's real tokens/s.
void print_fit_report(const TrainConfig& cfg, const TrainData& data, const TrainResult& res,
                      std::FILE* out);

// Where the sample goes: `print` writes it on `out`, `save` into the run's sample.txt.
struct SampleOutput {
  bool print = false;
  bool save = false;
  std::FILE* out = nullptr;
};

// generation.max_new_tokens tokens from the trained model after generation.prompt (every rank
// calls it: under ZeRO-3 each layer is gathered as the generation reaches it), or "" with a
// printed reason when the run's layout cannot generate (pipeline stages, context parallelism).
std::string run_sample(const TrainConfig& cfg, CausalLMModule& module, const TrainData& data,
                       const SampleOutput& output);

}  // namespace nxd::train_app

#pragma once
// nxd-generate's command line (tools/nxd_generate.cpp): the flags read into GenerateCli, checked
// against each other before anything is loaded. A mistake is a Usage error (exit code 2) naming
// the flag and its value.
#include <cstdint>
#include <string>
#include <vector>

#include "nxd/cli/exit.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/models/quantize_lm.h"

namespace nxd::generate_cli {

extern const char* const kUsage;

struct Usage : UserError {
  using UserError::UserError;
};

// Everything the command line says.
struct GenerateCli {
  std::string checkpoint, hf, gguf, prompt;
  std::string lora;  // --lora: a PEFT adapter folder
  bool has_prompt = false;
  GenerateOptions gen{.max_new_tokens = 32, .temperature = 0.0};
  int tp = 1;
  std::string backend = "sim";
  bool eager = false;
  WeightQuant quantize = WeightQuant::none;  // --quantize: eager only
  QuantizeOptions quant;                     // its format's options
  std::string instance;                      // empty: the smallest inf2 with tp cores
  std::vector<int64_t> buckets;
  std::string save_trace, load_trace;
  std::string tokenizer;       // a tokenizer.json, "bytes", or empty (the default)
  std::string quality_report;  // --quality-report FILE: perplexities, no generation
  int64_t window = 0;          // --window: its window (0: max_position_embeddings)
  std::string draft_model;     // --draft-model: speculative decoding's draft (eager only)
  int64_t speculate = 0;       // --speculate: tokens proposed per round (0: 4 with a draft)
};

// The command line read and checked (flags against each other, --instance against --tp).
GenerateCli parse_args(int argc, char** argv);

}  // namespace nxd::generate_cli

#pragma once
// nxd-generate --quality-report FILE: what precision costs on a held-out text. The text's tokens
// are cut as nxd-train cuts a corpus (consecutive windows of W + 1 tokens, stride W, W the
// model's max_position_embeddings or --window; the tail that fills no window is left out), and
// every window runs through the model six times: f32 weights and compute (the reference), bf16,
// and the decoder's linear layers quantized to int8 and to int4 (layers/models/quantize_lm.h;
// --quantize int4:G[:asym] picks the int4 form, default groups of 32, symmetric), each with the
// output head left in f32 and then quantized too (int8; --quantize int4...:head=int4 makes the
// int4 row's head int4). Printed per
// variant: the perplexity exp(mean NLL of every window's W targets, as CausalLM::loss and
// nxd-train's validation loss), the largest |logit - f32 logit| over every position and token,
// and the positions whose most likely next token is the f32 one's.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nxd/checkpoint/model_source.h"
#include "nxd/layers/quantize.h"

namespace nxd::tools {

struct QualityRow {
  std::string variant;  // "fp32", "bf16", "int8", "int8, head int8", "int4 (groups of 32, ...)"
  double mean_nll = 0, perplexity = 0, max_logit_change = 0;
  int64_t argmax_agree = 0;
};

struct QualityReport {
  int64_t tokens = 0, windows = 0, window = 0, left_out = 0;
  int64_t predicted = 0;  // targets per variant: windows * window
  std::vector<QualityRow> rows;
};

struct QualityOptions {
  int64_t window = 0;  // 0: the model's max_position_embeddings
  QuantizeOptions int4{.format = WeightQuant::int4};
  int tp = 1;
  std::string instance;  // the sim launch's machine
};

// Runs the six variants on `tokens` (every rank of a sim launch of opts.tp ranks).
// ConfigError when the text fills no window.
QualityReport quality_report(const ckpt::ModelSource& s, const std::vector<int64_t>& tokens,
                             const QualityOptions& opts);

void print_quality_report(const QualityReport& r, const std::string& file);

}  // namespace nxd::tools

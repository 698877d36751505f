#pragma once
// Weight-only quantization (int8, or int4 in groups) of a causal LM for generation
// (layers/quantize.h), with what it costs in quality on a given text: the logits of every position
// before and after, and the perplexity of the text's tokens both ways.
//
// Every linear layer of the decoder is quantized; the token embedding (a lookup: one row read per
// token, no product to speed up) stays in the model's dtype, and so does the output head unless
// opts.head says int8 or int4 (the head is a large share of a small model's bytes per token:
// llama.cpp stores it as Q8_0 in q8_0 files). A head tied to the embedding gets a quantized copy
// of its own (CausalLM::output_head_weights) and the embedding stays for the input lookup: the
// resident weights grow by that copy (1 + 4 / hidden bytes per embedding weight in int8) while a
// decode step reads the quantized copy instead of the f32 matrix (and one embedding row).
#include <cstdint>
#include <vector>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/quantize.h"

namespace nxd {

struct QuantizedLmReport {
  QuantizeSummary summary;       // the decoder's linear layers
  QuantizeSummary head;          // the output head (layers 0: left unquantized)
  int64_t positions = 0;         // of the text (0: no comparison made)
  double max_logit_change = 0;   // max |logit_int8 - logit| over positions and vocabulary
  double max_abs_logit = 0;      // max |logit| of the unquantized model
  double perplexity_before = 0;  // exp(mean NLL of text[1:] given the preceding tokens)
  double perplexity_after = 0;   // 0 when the text has one token
  int64_t argmax_agree = 0;      // positions whose most likely next token is unchanged
};

// Quantizes m (a whole model, eager, any TP without sequence parallelism: every rank of the TP
// group calls it) in place. `text` (may be empty: no comparison) is
// run through the model before and after. Throws InvalidArgument as quantize_linear_layers.
QuantizedLmReport quantize_causal_lm(CausalLM& m, const std::vector<int64_t>& text,
                                     WeightQuant format = WeightQuant::int8);
// The same with the format's options (int4: group size and zero point; opts.head: the output
// head's format). The decoder's layers are quantized with the output head in opts.skip; then
// quantize_output_head when opts.head is int8 or int4 and the head is not quantized already (a
// GGUF file's q8_0 / q4_0 head, checkpoint/gguf_llama.h, is kept as loaded).
QuantizedLmReport quantize_causal_lm(CausalLM& m, const std::vector<int64_t>& text,
                                     QuantizeOptions opts);

// Quantizes m's output head in `format` (int8, or int4 in opts.group and opts.zero), this rank's
// vocabulary rows at TP > 1 (no collective). An untied head's f32/bf16 weight is freed as a
// quantized layer's is; a tied one keeps the embedding and adds the quantized copy.
// InvalidArgument when the head is quantized already or m is not a whole model.
QuantizeSummary quantize_output_head(CausalLM& m, WeightQuant format, const QuantizeOptions& opts);

// Sum over positions i < n of -log softmax(logits[i])[targets[i]], in f64; logits [n, V] (f32).
double sum_nll(const float* logits, const int64_t* targets, int64_t n, int64_t V);

}  // namespace nxd

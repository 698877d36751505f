#pragma once
// Weight-only quantization (int8, or int4 in groups) of a causal LM for generation
// (layers/quantize.h), with what it costs in quality on a given text: the logits of every position
// before and after, and the perplexity of the text's tokens both ways.
//
// Every linear layer of the decoder is quantized; the token embedding (a lookup: one row read per
// token, no product to speed up) and the output head (its logits are what sampling reads, and at
// TP 1 CausalLM::lm_head multiplies by the weight directly) stay in the model's dtype.
#include <cstdint>
#include <vector>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/quantize.h"

namespace nxd {

struct QuantizedLmReport {
  QuantizeSummary summary;
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
// The same with the format's options (int4: group size and zero point); opts.skip gets the
// output head added.
QuantizedLmReport quantize_causal_lm(CausalLM& m, const std::vector<int64_t>& text,
                                     QuantizeOptions opts);

// Sum over positions i < n of -log softmax(logits[i])[targets[i]], in f64; logits [n, V] (f32).
double sum_nll(const float* logits, const int64_t* targets, int64_t n, int64_t V);

}  // namespace nxd

#include "nxd/layers/models/quantize_lm.h"

#include <algorithm>
#include <cmath>

namespace nxd {

namespace {

// logits [S, V] (f32) of the text, one forward.
std::vector<float> text_logits(CausalLM& m, const std::vector<int64_t>& text) {
  NoGradGuard no_grad;
  const int64_t S = static_cast<int64_t>(text.size());
  Tensor logits = m.forward(from_vector(text, {1, S})).to(DType::f32).contiguous();
  const float* p = logits.data<float>();
  return std::vector<float>(p, p + logits.numel());
}

// exp(mean over i of -log softmax(logits[i])[text[i + 1]]), in f64.
double perplexity(const std::vector<float>& logits, const std::vector<int64_t>& text, int64_t V) {
  const int64_t S = static_cast<int64_t>(text.size());
  if (S < 2) return 0;
  return std::exp(sum_nll(logits.data(), text.data() + 1, S - 1, V) / static_cast<double>(S - 1));
}

int64_t argmax(const float* row, int64_t V) {
  return std::max_element(row, row + V) - row;
}

}  // namespace

double sum_nll(const float* logits, const int64_t* targets, int64_t n, int64_t V) {
  double nll = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits + i * V;
    const double mx = *std::max_element(row, row + V);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - mx);
    nll += mx + std::log(z) - row[targets[i]];
  }
  return nll;
}

QuantizedLmReport quantize_causal_lm(CausalLM& m, const std::vector<int64_t>& text,
                                     WeightQuant format) {
  return quantize_causal_lm(m, text, QuantizeOptions{.format = format});
}

QuantizedLmReport quantize_causal_lm(CausalLM& m, const std::vector<int64_t>& text,
                                     QuantizeOptions opts) {
  NXD_CHECK(!m.sequence_parallel(),
            "[quantize] quantized weights run without sequence parallelism (the model has it)");
  NXD_CHECK(m.is_whole(), "[quantize] needs the whole model, not a pipeline stage");
  if (!m.output_head_name().empty()) opts.skip.push_back(m.output_head_name());
  QuantizedLmReport r;
  const int64_t V = m.config().vocab_size;
  std::vector<float> before;
  if (!text.empty()) before = text_logits(m, text);
  r.summary = quantize_linear_layers(m, opts);
  // a head loaded quantized (a GGUF file's q8_0 / q4_0 output tensor) is kept as it is
  if (opts.head != WeightQuant::none && !m.output_head_weights().quantized())
    r.head = quantize_output_head(m, opts.head, opts);
  if (text.empty()) return r;
  const std::vector<float> after = text_logits(m, text);
  r.positions = static_cast<int64_t>(text.size());
  for (size_t i = 0; i < before.size(); ++i) {
    r.max_logit_change = std::max(r.max_logit_change, std::abs(double(after[i]) - before[i]));
    r.max_abs_logit = std::max(r.max_abs_logit, std::abs(double(before[i])));
  }
  for (int64_t i = 0; i < r.positions; ++i)
    r.argmax_agree += argmax(before.data() + i * V, V) == argmax(after.data() + i * V, V);
  r.perplexity_before = perplexity(before, text, V);
  r.perplexity_after = perplexity(after, text, V);
  return r;
}

QuantizeSummary quantize_output_head(CausalLM& m, WeightQuant format, const QuantizeOptions& opts) {
  NXD_CHECK(m.is_whole(), "[quantize] the output head needs the whole model, not a pipeline stage");
  NXD_CHECK(format == WeightQuant::int8 || format == WeightQuant::int4,
            "[quantize] the output head's format must be int8 or int4, got ",
            weight_quant_name(format));
  QuantizableLinear& head = m.output_head_weights();
  const std::string name =
      m.output_head_name().empty() ? "the tied output head" : m.output_head_name();
  NXD_CHECK(!head.quantized(), "[quantize] ", name, " is quantized already");
  const Tensor w = m.output_head_weight();
  QuantizeSummary s;
  s.layers = 1;
  s.weights = w.numel();
  s.bytes_before = w.numel() * dtype_size(w.dtype());
  s.bytes_after = set_quantized_weight(head, w, with_format(opts, format));
  if (!m.output_head_tied()) release_quantized_weight(w);  // a tied one is the embedding
  return s;
}

}  // namespace nxd

#include "generate_quality.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/models/quantize_lm.h"

namespace nxd::tools {

namespace {

// The unquantized weights as full tensors (an nxd checkpoint is read merged).
std::map<std::string, Tensor> full_tensors(const ckpt::ModelSource& s) {
  if (s.tag_dir.empty()) return s.full;
  std::map<std::string, Tensor> full;
  for (auto& [n, t] : ckpt::read_merged_model(s.tag_dir)) full[n] = t;
  return full;
}

struct Variant {
  std::string name;
  DType dtype = DType::f32;
  QuantizeOptions quant{.format = WeightQuant::none};
};

// The window's logits [W, V] in f32.
std::vector<float> window_logits(CausalLM& m, const std::vector<int64_t>& ids) {
  NoGradGuard g;
  const Tensor lg = m.forward(from_vector(ids, {1, static_cast<int64_t>(ids.size())}))
                        .to(DType::f32)
                        .contiguous();
  return std::vector<float>(lg.data<float>(), lg.data<float>() + lg.numel());
}

}  // namespace

QualityReport quality_report(const ckpt::ModelSource& s, const std::vector<int64_t>& tokens,
                             const QualityOptions& opts) {
  QualityReport r;
  r.window = opts.window > 0 ? opts.window : s.cfg.max_position_embeddings;
  r.tokens = static_cast<int64_t>(tokens.size());
  r.windows = r.tokens > r.window ? (r.tokens - 1) / r.window : 0;
  if (r.windows == 0)
    throw ConfigError(str("[nxd-generate] --quality-report: the text has ", r.tokens,
                          " tokens, fewer than one window of ", r.window + 1,
                          " (--window, at most max_position_embeddings)"));
  r.predicted = r.windows * r.window;
  r.left_out = r.tokens - 1 - r.predicted;
  // int8 and int4 each with the output head unquantized, then quantized (int8, or --quantize's
  // :head=int4)
  QuantizeOptions int4 = opts.int4, int4_head = opts.int4;
  int4.head = WeightQuant::none;
  if (int4_head.head == WeightQuant::none) int4_head.head = WeightQuant::int8;
  const QuantizeOptions int8_head{.format = WeightQuant::int8, .head = WeightQuant::int8};
  const std::vector<Variant> variants = {{"fp32", DType::f32, {.format = WeightQuant::none}},
                                         {"bf16", DType::bf16, {.format = WeightQuant::none}},
                                         {"int8", DType::f32, {.format = WeightQuant::int8}},
                                         {describe(int8_head), DType::f32, int8_head},
                                         {describe(int4), DType::f32, int4},
                                         {describe(int4_head), DType::f32, int4_head}};
  const std::map<std::string, Tensor> full = full_tensors(s);
  const std::string source = s.tag_dir.empty() ? s.hf_dir : s.tag_dir.string();
  const int64_t V = s.cfg.vocab_size, W = r.window;
  std::mutex mu;
  sim::LaunchOptions lo;
  lo.world_size = opts.tp;
  if (!opts.instance.empty()) lo.instance = opts.instance;
  sim::launch(lo, [&] {
    parallel_state::initialize_model_parallel(opts.tp);
    std::vector<std::shared_ptr<CausalLM>> models;
    for (const Variant& v : variants) {
      ModelConfig cfg = s.cfg;
      cfg.dtype = v.dtype;
      auto m = make_causal_lm(cfg, 0);
      ckpt::load_full_tensors({m.get()}, full, source);
      if (v.quant.format != WeightQuant::none) quantize_causal_lm(*m, {}, v.quant);
      models.push_back(m);
    }
    std::vector<QualityRow> rows(variants.size());
    std::vector<double> nll(variants.size(), 0.0);
    for (int64_t w = 0; w < r.windows; ++w) {
      const std::vector<int64_t> ids(tokens.begin() + w * W, tokens.begin() + w * W + W);
      std::vector<float> ref;
      for (size_t i = 0; i < variants.size(); ++i) {
        const std::vector<float> lg = window_logits(*models[i], ids);
        if (i == 0) ref = lg;
        nll[i] += sum_nll(lg.data(), tokens.data() + w * W + 1, W, V);
        for (int64_t p = 0; p < W; ++p) {
          const float* row = lg.data() + p * V;
          const float* rr = ref.data() + p * V;
          rows[i].argmax_agree +=
              std::max_element(row, row + V) - row == std::max_element(rr, rr + V) - rr;
          for (int64_t t = 0; t < V; ++t)
            rows[i].max_logit_change =
                std::max(rows[i].max_logit_change, std::abs(double(row[t]) - rr[t]));
        }
      }
    }
    for (size_t i = 0; i < variants.size(); ++i) {
      rows[i].variant = variants[i].name;
      rows[i].mean_nll = nll[i] / static_cast<double>(r.predicted);
      rows[i].perplexity = std::exp(rows[i].mean_nll);
    }
    std::lock_guard g(mu);
    if (parallel_state::get_tensor_model_parallel_rank() == 0) r.rows = rows;
  });
  return r;
}

void print_quality_report(const QualityReport& r, const std::string& file) {
  std::printf(
      "quality report: %s: %lld tokens, %lld windows of %lld targets (%lld predicted per "
      "variant, %lld left out at the end)\n",
      file.c_str(), (long long)r.tokens, (long long)r.windows, (long long)r.window,
      (long long)r.predicted, (long long)r.left_out);
  for (const QualityRow& q : r.rows)
    std::printf(
        "  %-48s perplexity %.6f (mean NLL %.6f), max logit change vs fp32 %.4g, most likely "
        "token unchanged at %lld/%lld\n",
        q.variant.c_str(), q.perplexity, q.mean_nll, q.max_logit_change, (long long)q.argmax_agree,
        (long long)r.predicted);
}

}  // namespace nxd::tools

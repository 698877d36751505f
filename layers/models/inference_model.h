#pragma once
// The modeled latency of generation on a simulated Neuron instance: the KV-cache path
// (forward_cached) run on meta tensors over TP sim ranks, every kernel and collective charged to
// the sim device exactly as training is (roofline per kernel: max(FLOPs / TensorE peak, bytes /
// HBM bandwidth); collectives by collectives/sim's model), with one fitted constant: the fraction
// of the HBM bandwidth the kernels reach in inference (docs/design/generation.md "The sim inference
// model": how it is built, the figure it was fitted on, what it leaves out). Allocates nothing.
#include <cstdint>
#include <string>

#include "nxd/layers/models/config.h"

namespace nxd {

// Fitted once on Llama-2-7B, BF16, batch 1, inf2.xlarge, TP 2, 256 tokens in / 256 out: 30.1 ms
// per output token (end-to-end latency / output tokens, prefill included; PyTorch blog
// "High-Performance Llama 2 Deployments with AWS Inferentia2 using TorchServe",
// transformers-neuronx, Neuron SDK 2.13: https://pytorch.org/blog/high-performance-llama/).
// docs/HARDWARE.md.
inline constexpr double kInferenceHbmEfficiency = 0.517;

struct InferenceModelOptions {
  int tp = 1;
  std::string instance = "inf2.xlarge";  // sim::machine() names
  int64_t batch = 1;
  int64_t prompt_tokens = 128;
  int64_t new_tokens = 128;
  double hbm_efficiency = kInferenceHbmEfficiency;
};

struct InferenceEstimate {
  std::string machine;
  double ttft = 0;           // s: the prefill of the prompt (context encoding), first token out
  double tpot = 0;           // s: one decode step attending a cache of prompt + new tokens
  double e2e_per_token = 0;  // (ttft + (new_tokens - 1) * tpot) / new_tokens
  int64_t weight_bytes = 0;  // per rank
  int64_t kv_bytes = 0;      // per rank (the cache of batch x (prompt + new) positions)
};

// cfg on `tp` sim ranks of `instance` (sequence parallelism off, kv_size_multiplier set for tp);
// ConfigError for a model that does not split over tp or an unknown instance.
InferenceEstimate estimate_inference(ModelConfig cfg, const InferenceModelOptions& opts);

}  // namespace nxd

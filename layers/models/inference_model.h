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

// The sizes the Neuron libraries shard a model with at TP `tp`, so that every model splits:
// attention heads by NxD's rule (layers/parallel/pad.h: multi-head pads query and KV heads to the
// next multiple of tp; grouped-query keeps or pads the KV heads to a count that divides or is
// divided by tp, replicates them tp / kv times, and pads each group's query heads), the MLP's
// intermediate size and the vocabulary up to a multiple of tp (transformers-neuronx and NxD
// Inference pad both so that their column-parallel shards are equal). Padded rows are zero: the
// model computes the same function, but every padded row is streamed and multiplied like a real
// one, which the estimate charges.
struct InferencePadding {
  ModelConfig padded;                             // the config the estimate builds
  int64_t heads = 0, kv_heads = 0;                // the model's
  int64_t padded_heads = 0, padded_kv_heads = 0;  // KV heads before replication
  int64_t kv_replicas = 1;                        // kv_size_multiplier
  int64_t ffn = 0, padded_ffn = 0, vocab = 0, padded_vocab = 0;
  bool needed() const;
  // "attention heads 64 -> 72, KV heads 8 replicated x3 (24 over 24 ranks), FFN 28672, ..."
  std::string describe() const;
};
InferencePadding pad_for_inference(const ModelConfig& cfg, int tp);

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
  InferencePadding padding;  // the sizes the model was built with
  double output_tokens_per_s = 0;  // batch x new_tokens / (ttft + (new_tokens - 1) tpot)
};

// cfg, padded for tp (pad_for_inference), on `tp` sim ranks of `instance` (sequence parallelism
// off); ConfigError for an unknown instance or a tp past its NeuronCores.
InferenceEstimate estimate_inference(ModelConfig cfg, const InferenceModelOptions& opts);

}  // namespace nxd

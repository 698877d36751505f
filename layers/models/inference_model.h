#pragma once
// The modeled latency of generation on a simulated Neuron instance: the KV-cache path
// (forward_cached) run on meta tensors over TP sim ranks, every kernel and collective charged to
// the sim device exactly as training is (roofline per kernel: max(FLOPs / TensorE peak, bytes /
// HBM bandwidth); collectives by collectives/sim's model), the prompt padded to its context
// bucket, recharged where the inference libraries differ from the training kernels (bf16
// all-reduces, fused elementwise kernels, the materialized prefill attention), plus the fixed
// costs a step pays beyond its rooflines (InferenceOverheads: per kernel, per collective, the
// softmax rows, on-device sampling; each from a published figure), with one fitted constant: the
// fraction of the HBM bandwidth the kernels reach in inference (docs/design/inference_model.md: how
// it is built, the figures, what it leaves out; docs/VALIDATION.md: every published row against
// it). Allocates nothing.
#include <cstdint>
#include <string>
#include <vector>

#include "nxd/layers/models/config.h"

namespace nxd {

// Fitted once on Llama-2-70B, BF16, batch 1, inf2.48xlarge, TP 24, 128 tokens in / 128 out:
// TPOT 32.90 ms (P50; transformers-neuronx, Neuron SDK 2.18.0: aws-neuron-sdk
// general/benchmarks/inf2/latency_data_decoder.csv, "Inf2 Inference Performance" of 2024-04-30;
// docs/HARDWARE.md). The model gives 32.86 ms (32.89 before the bf16 all-reduces and the fused
// elementwise kernels; not refitted: within the calibration test's 0.05 ms).
inline constexpr double kInferenceHbmEfficiency = 0.501;

// The fixed costs a step pays beyond its rooflines, each from a published figure (none fitted;
// docs/design/inference_model.md).
struct InferenceOverheads {
  // per kernel: a DMA transfer's descriptor setup, synchronization and semaphore-to-start
  // (~1,300 ns: NKI "DMA bandwidth" deep dive) plus one dependent instruction's static overhead
  // (100 Vector engine cycles at 1.12 GHz: NKI Trainium/Inferentia2 architecture guide)
  double kernel_seconds = 1.3e-6 + 100 / 1.12e9;
  // the least a collective takes: a small all-reduce as a reduce-scatter and an all-gather, each
  // at the 10.0 us P50 nccom-test measured for an 8-rank 1 KiB all-gather (nccom-test page)
  double collective_seconds = 2 * 10.0e-6;
  // passes of the attention softmax over each score row on the Vector/Scalar engines (max, exp,
  // sum, normalize), each one element per cycle per SBUF partition (NKI architecture guide's
  // cost model: a one-input instruction of free size N takes about N cycles)
  int softmax_passes = 4;
  // elementwise kernels (norms, residual adds, activation, rotary) fused by the compiler: charged
  // their Vector engine time, FLOPs / (lanes x clock), instead of an HBM round trip each (the
  // NKI architecture guide: 128 partitions, one element a cycle each)
  bool fuse_elementwise = true;
  double vector_lanes = 128;
  // HBM bytes per score of a materialized prefill attention whose layer's score matrix exceeds
  // the SBUF: the bf16 score written once and read by the row max, the exp-sum and the
  // normalization (elementwise ops fused into them), the bf16 probabilities written once and read
  // by the product with V: 2 + 3 x 2 + 2 + 2
  double score_bytes_through_hbm = 12;
};

// How the prefill's attention is built. materialized: as transformers-neuronx builds it in HLO
// (layers/attention.py at SDK 2.18: the full score matrix Q K^T, a Select for the causal mask, a
// softmax upcast to f32, the product with V), so every score is computed and a layer's score
// matrix goes through HBM when it exceeds the SBUF; flash: a flash-attention kernel (NxD
// Inference's NKI attention kernel, attn_kernel_enabled), causal blocks only, scores on chip.
enum class PrefillAttention { materialized, flash };

// What one step was charged beyond its rooflines (rank 0).
struct StepCharges {
  int64_t kernels = 0, collectives = 0;
  double fixed_seconds = 0;    // kernels x kernel_seconds + collectives raised to their floor
  double softmax_seconds = 0;  // the score rows on the Vector engine
  // elementwise kernels at their Vector engine time instead of their rooflines (<= 0)
  double fused_seconds = 0;
  // bf16 all-reduces charged at 2 bytes an element instead of the sim's f32 reduction (<= 0)
  double collective_dtype_seconds = 0;
  // prefill, PrefillAttention::materialized: the masked half of the score products and the score
  // matrix's HBM trips when it exceeds the SBUF
  double attention_seconds = 0;
};

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

// The context-encoding buckets of NxD Inference's automatic bucketing up to max_context_tokens:
// the powers of two from 128 below 2^round(log2(max)), then max itself (NxDI feature guide,
// "Bucketing"; modules/autobucketing.py generate_buckets): 12,288 gives 128 ... 8,192, 12,288;
// 11,500 gives 128 ... 4,096, 11,500. transformers-neuronx's default context buckets are powers of
// two as well (half its token buckets), so the published power-of-two prompts run unpadded.
std::vector<int64_t> context_buckets(int64_t max_context_tokens);
// The smallest of those buckets that holds the prompt. ConfigError unless 1 <= prompt_tokens <=
// max_context_tokens.
int64_t context_bucket(int64_t prompt_tokens, int64_t max_context_tokens);

struct InferenceModelOptions {
  int tp = 1;
  std::string instance = "inf2.xlarge";  // sim::machine() names
  int64_t batch = 1;
  int64_t prompt_tokens = 128;
  int64_t new_tokens = 128;
  // the prefill runs the prompt padded to its context bucket (context_bucket) when true, of the
  // buckets up to max_context_tokens (the served max context length; 0 = prompt + new tokens)
  bool context_buckets = true;
  int64_t max_context_tokens = 0;
  PrefillAttention prefill_attention = PrefillAttention::materialized;
  double hbm_efficiency = kInferenceHbmEfficiency;
  InferenceOverheads overheads;
};

struct InferenceEstimate {
  std::string machine;
  double ttft = 0;             // s: the prefill of the prompt (context encoding), first token out
  int64_t context_tokens = 0;  // the prompt's length in the prefill: its context bucket
  double tpot = 0;             // s: one decode step attending a cache of prompt + new tokens
  double e2e_per_token = 0;    // (ttft + (new_tokens - 1) * tpot) / new_tokens
  int64_t weight_bytes = 0;    // per rank
  int64_t kv_bytes = 0;        // per rank (the cache of batch x (prompt + new) positions)
  InferencePadding padding;    // the sizes the model was built with
  StepCharges prefill, decode;
  // per step (TTFT's first token and every decode step): on-device sampling, one kernel over the
  // batch's gathered f32 logits
  double sampling_seconds = 0;
  double output_tokens_per_s = 0;  // batch x new_tokens / (ttft + (new_tokens - 1) tpot)
};

// cfg, padded for tp (pad_for_inference), on `tp` sim ranks of `instance` (sequence parallelism
// off); ConfigError for an unknown instance or a tp past its NeuronCores.
InferenceEstimate estimate_inference(ModelConfig cfg, const InferenceModelOptions& opts);

}  // namespace nxd

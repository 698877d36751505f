#pragma once
// Tracing a decoder as NxD Inference does: a context-encoding graph per prompt-length bucket
// (prefill) and a token-generation graph (decode, one new token per row), all in one
// TensorParallelModel so they share one copy of the weights and the K/V caches, which are state
// tensors written in place by the graphs' kv_cache_write nodes (no copy).
//
// Inputs of every graph: ids [B, S] (rows right-padded), seq_ids, start, lengths (i64 [B], the
// CacheStep of layers/models/kv_cache.h); output: the logits [B, V] of each row's last real
// token. Prefill buckets are (batch, prompt bucket); decode buckets (n, 1) for n = 1..batch (rows
// leave the batch as they finish). Departure from NxD Inference: decode is not bucketed on the
// cache length: cached_attention reads only positions [0, start + s] of a row, so a shorter
// cache bucket would not make a step cheaper.
#include <functional>
#include <memory>
#include <vector>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/trace/model.h"

namespace nxd::trace {

struct DecoderTraceOptions {
  int tp_degree = 1;
  std::vector<int64_t> prefill_buckets;  // prompt lengths; empty: powers of two up to max_len
  int64_t batch = 1;                     // cache rows (prompts per generate call)
  int64_t max_len = 0;                   // cache positions; 0: max_position_embeddings
  std::string workdir, args;
  std::string backend = "sim";
  int max_parallel_compilations = 1;
};

using CausalLMFactory = std::function<std::shared_ptr<CausalLM>()>;

// The model_fn of a decoder: builds the model with `make` on each rank (eval mode) and a KV cache
// of `batch` rows and `max_len` positions (state "k<l>", "v<l>").
ModelFn causal_lm_decoder_fn(CausalLMFactory make, int64_t batch, int64_t max_len);

// Traces the decoder's prefill and decode graphs (opts.prefill_buckets must not exceed max_len).
std::shared_ptr<TensorParallelModel> trace_decoder(CausalLMFactory make,
                                                   const DecoderTraceOptions& opts);

// Generation on a traced decoder: prompts (at most the decoder's batch, each shorter than its
// largest prefill bucket) prefilled in one call, then one decode call per step; sampling as
// CausalLM::generate_batch (same RNG stream and sample_token), so tokens equal the eager path's.
GenerateResult traced_generate(TensorParallelModel& model,
                               const std::vector<std::vector<int64_t>>& prompts,
                               const GenerateOptions& opts);

}  // namespace nxd::trace

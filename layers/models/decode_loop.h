#pragma once
// The one generation loop over a cached step: CausalLM::generate_batch runs it on the eager model
// (forward_cached), trace::traced_generate on a traced decoder (TensorParallelModel::forward).
// One prefill of all prompts (rows right-padded), then one decode step per token for the rows
// still running (rows leave as they stop; each keeps its cache row b), sampling and stop rules by
// advance_generation_row (causal_lm.h).
#include <functional>
#include <vector>

#include "nxd/layers/models/causal_lm.h"

namespace nxd {

// ids [B, S] and the rows' CacheStep (kv_cache.h) -> the logits [B, V] of each row's last token.
using CachedStepFn = std::function<Tensor(const Tensor& ids, const CacheStep& step)>;

struct DecodeLoopOptions {
  int64_t max_pos = 0;       // the cache length: a sequence that reaches it stops
  int64_t prefill_rows = 0;  // > #prompts: the prefill is padded to this many rows, each extra
                             // row repeating prompt 0 in its own cache row (a traced decoder's
                             // fixed batch); its logits are ignored
};

// prompts must be non-empty (the callers check them). The result's times are the wall clock and
// the sim clock of the calling thread (0 without one).
GenerateResult decode_loop(const std::vector<std::vector<int64_t>>& prompts,
                           const GenerateOptions& opts, const DecodeLoopOptions& lo,
                           const CachedStepFn& step);

namespace decode_detail {  // shared with generate.cpp's loop without a cache
double wall();             // seconds of the steady clock
double modeled();          // the calling thread's sim clock, 0 without one
// The rows' sequences and stop reasons appended to r.
GenerateResult finish(std::vector<GenerationRow>& rows, GenerateResult r);
}  // namespace decode_detail

}  // namespace nxd

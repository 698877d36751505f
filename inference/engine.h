#pragma once
// The serving engine: continuous batching of requests over one eager CausalLM with a paged KV
// cache (docs/design/inference.md). Requests are submitted from any thread; one engine thread runs
// step() (or run()), which schedules the waiting and running requests under a token budget
// (decode rows and chunked prefill), runs the model, samples each request's next token with its
// own parameters and reports the new text through the request's callback.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

#include "nxd/runtime/error.h"

namespace nxd {
class CausalLM;
namespace io {
class Tokenizer;
}
}  // namespace nxd

namespace nxd::inference {

struct SamplingParams {             // per request
  double temperature = 1.0;         // 0: greedy (argmax, lowest id on ties)
  int64_t top_k = 0;                // 0: off
  double top_p = 1.0;               // (0, 1]
  double min_p = 0.0;               // [0, 1]
  double repetition_penalty = 1.0;  // > 0 (transformers/vLLM: over prompt + generated ids)
  double presence_penalty = 0.0;    // OpenAI: [-2, 2] over generated ids
  double frequency_penalty = 0.0;   // OpenAI: [-2, 2]
  uint64_t seed = 0;                // token i of a request draws u_i from its own stream:
                                    // same tokens whatever is batched with it
  int64_t logprobs = -1;            // < 0: none; n >= 0: the chosen id's logprob + n most likely
};

struct StopParams {
  int64_t max_tokens = 16;              // >= 1
  std::vector<std::string> stop;        // stop strings: generation ends, the string is not output
  std::vector<int64_t> stop_token_ids;  // besides the model's EOS ids
  bool ignore_eos = false;
};

enum class FinishReason {
  none,
  eos,            // one of the model's EOS ids
  stop_token,     // one of stop_token_ids
  stop_string,    // one of the stop strings
  length,         // max_tokens
  context_limit,  // the sequence reached max_model_len
  cancelled,
  error
};
const char* to_string(FinishReason);             // "eos", "stop_string", ...
const char* openai_finish_reason(FinishReason);  // "stop" | "length" | "cancelled" | "error" | ""

struct Request {
  std::vector<int64_t> prompt;
  SamplingParams sampling;
  StopParams stop;
};

struct TokenLogprob {
  int64_t id = 0;
  double logprob = 0;
};

struct Output {  // one per step that produced text, and a final one
  int64_t request_id = 0;
  std::vector<int64_t> ids;  // new ids since the previous Output
  std::string text;          // their text (held back while it may be the start of a stop string)
  std::vector<TokenLogprob> chosen;            // per new id, when logprobs >= 0
  std::vector<std::vector<TokenLogprob>> top;  // per new id, the n most likely
  FinishReason finish = FinishReason::none;    // != none: the last Output of the request
  std::string error;                           // when finish == error
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_prompt_tokens = 0;
  double ttft_s = 0;  // wall: submit -> first token
};
using OutputCallback =
    std::function<void(const Output&)>;  // runs on the engine thread; no blocking

// How a step's prefill chunks run (docs/design/inference.md, "Batch invariance"): each request's
// chunk in a call of its own (the default), so that its K/V and logits have the bits it gets alone
// whatever else is prefilled in the step, or chunks of similar length from several requests in
// one padded call (each weight read once per call; the serving mix measured the same CPU time
// within 2%).
enum class PrefillCalls { batched, per_request };

struct EngineOptions {
  int64_t max_num_seqs = 16;             // running requests
  int64_t max_num_batched_tokens = 512;  // token budget of one step (decode rows + prefill chunks)
  int64_t block_size = 16;               // KV block positions
  int64_t kv_blocks = 0;  // 0: from kv_memory_bytes (bytes / one block's K and V over all
                          // layers), else max_num_seqs sequences of max_model_len positions
  int64_t kv_memory_bytes = 0;
  int64_t max_waiting = 256;  // submit beyond it throws QueueFull (server: 429)
  bool prefix_caching = true;
  bool chunked_prefill = true;
  // With chunked prefill, at most this many prompt tokens of one request per step (vLLM's
  // long_prefill_token_threshold), so that a long prompt shares each step's budget with the
  // others' prefill and holds the decode rows for less; 0: no limit (a request may take the whole
  // budget).
  int64_t long_prefill_token_threshold = 0;
  PrefillCalls prefill_calls = PrefillCalls::per_request;
  // The model's end-of-sequence ids (read_eos_ids of its folder); empty: none.
  std::vector<int64_t> eos_token_ids;
  int64_t max_model_len = 0;  // 0: the model's max_position_embeddings
  // Speculative decoding (docs/design/inference.md): a draft model sharing the model's vocabulary
  // proposes speculate_k tokens per decoding request and step, the model verifies them in one
  // call. Null: off. With the model at TP N the draft is built at TP 1 (rank 0 alone runs it;
  // every rank may pass the same object) or at TP N on each rank's thread (sharded as the model).
  std::shared_ptr<CausalLM> draft_model;
  int64_t speculate_k = 4;  // 1..64 when draft_model is set
};

struct EngineStats {
  int64_t waiting = 0, running = 0, kv_blocks_total = 0, kv_blocks_used = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, preemptions = 0, steps = 0;
  int64_t model_calls = 0;  // forward calls (a step runs its decode rows together, 32 a call at
                            // most, and each prefill chunk alone, or with PrefillCalls::batched
                            // chunks of similar lengths together)
  int64_t kv_blocks_rolled = 0;  // blocks returned while their sequence ran: a sliding window's
                                 // positions no later query reads
  int64_t spec_proposed = 0, spec_accepted = 0;  // draft tokens proposed, of those accepted
  double acceptance_rate() const {
    return spec_proposed ? double(spec_accepted) / double(spec_proposed) : 0.0;
  }
};

// The queue of waiting requests is full (a server answers 429).
class QueueFull : public Error {
 public:
  using Error::Error;
};

// The EOS ids of a transformers folder: generation_config.json's eos_token_id when the file has
// one, else config.json's (an int or a list); empty when neither names one. IoError/ConfigError
// for unreadable or malformed files.
std::vector<int64_t> read_eos_ids(const std::filesystem::path& hf_dir);

class Engine {
 public:
  // model: a whole CausalLM with a KV-cache path, without sequence parallelism. tokenizer may be
  // null (then no text, no stop strings). InvalidArgument for bad options.
  // Tensor parallelism (a model built at TP > 1 over sim ranks or MPI processes): every rank of
  // the TP group builds its Engine on its rank thread with the same options. Rank 0 takes the
  // requests (submit/cancel elsewhere throw), schedules, samples and broadcasts each model call
  // (and a sharded draft's; a TP 1 draft runs on rank 0 alone) to the others; the others call run()
  // or run_until_idle() once for each such call on rank 0 (they follow its steps until that call
  // ends) — step() on them follows one message.
  Engine(std::shared_ptr<CausalLM> model, std::shared_ptr<const io::Tokenizer> tokenizer,
         EngineOptions opts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  std::vector<int64_t> eos_ids() const;
  int64_t max_model_len() const;
  const EngineOptions& options() const;
  // Thread-safe. InvalidArgument naming the field for a bad request (or one that can never fit
  // the KV cache, naming the sizes); QueueFull when max_waiting requests wait. Returns its id.
  int64_t submit(Request r, OutputCallback cb);
  // Thread-safe; takes effect at the next step: frees its blocks, final Output `cancelled`.
  // Unknown or finished ids are ignored.
  void cancel(int64_t request_id);
  bool step();  // one scheduler step; false when there was nothing to do
  void run_until_idle();
  void run(std::stop_token st);  // the serving loop: blocks (no spin) while idle
  EngineStats stats() const;     // thread-safe

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nxd::inference

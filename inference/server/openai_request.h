#pragma once
// OpenAI request bodies (POST /v1/completions, /v1/chat/completions) checked and turned into an
// engine Request. Every refusal is an ApiError: an HTTP status and OpenAI's error object naming
// the field ("param"), e.g. 400 {"error": {"message": "max_tokens must be an integer in [1, 64],
// got 0", "type": "invalid_request_error", "param": "max_tokens", "code": null}}.
//
// Fields (unknown fields are ignored, as vLLM does):
//   both   model (the served name, else 404 model_not_found), stream, stream_options.include_usage,
//          max_tokens (chat also max_completion_tokens), temperature [0, 2], top_p (0, 1],
//          n (1 only), stop (a string or up to 16), seed, presence_penalty and
//          frequency_penalty [-2, 2], logit_bias (empty only), and vLLM's top_k, min_p,
//          repetition_penalty, ignore_eos, stop_token_ids
//   completions  prompt (a string, a list of one string, or a list of token ids), logprobs
//          (0..20), echo (false only), best_of (1 only), suffix (none only)
//   chat   messages (the chat template's input: role and content, a string or a list of
//          {"type": "text", "text": ...} parts; other keys are passed to the template), tools,
//          logprobs (bool) with top_logprobs (0..20)
// The prompt must leave room for a token: prompt tokens < the model's context; max_tokens
// (default: 16 for completions, the rest of the context for chat) must fit beside it.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "nxd/inference/engine.h"

namespace nxd::io {
class Tokenizer;
class ChatTemplate;
}  // namespace nxd::io

namespace nxd::inference::server {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string param, const std::string& message,
           std::string type = "invalid_request_error", std::string code = "");
  int status;
  std::string param, type, code;
};
// {"error": {"message", "type", "param", "code"}} (param and code null when empty)
nlohmann::json error_body(const ApiError& e);

enum class Endpoint { completions, chat };

// What checking a request needs to know about the server.
struct RequestLimits {
  std::string served_model_name;
  const io::Tokenizer* tokenizer = nullptr;         // null: token-id prompts only
  const io::ChatTemplate* chat_template = nullptr;  // null: chat answers 400
  int64_t max_model_len = 0;
  int64_t vocab_size = 0;  // the model's: token ids must be below it
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::completions;
  Request request;  // prompt ids, sampling, stop
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int64_t top_logprobs = 0;    // how many alternatives each token reports (logprobs on)
  bool logprobs = false;
};

// The body (already read, at most the server's limit) as a request; ApiError otherwise.
ParsedRequest parse_request(Endpoint endpoint, const std::string& body,
                            const RequestLimits& limits);

// The byte offset of the first byte that is not valid UTF-8 in s, or npos.
size_t invalid_utf8_at(const std::string& s);

}  // namespace nxd::inference::server

#pragma once
// OpenAI response bodies from the engine's Outputs: a whole completion (text_completion,
// chat.completion) or its streamed chunks (text_completion, chat.completion.chunk), usage and
// logprobs in OpenAI's two shapes (completions: tokens/token_logprobs/top_logprobs/text_offset;
// chat: content[{token, logprob, bytes, top_logprobs}]).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nxd/inference/engine.h"
#include "nxd/inference/server/openai_request.h"

namespace nxd::io {
class Tokenizer;
}

namespace nxd::inference::server {

// One response's fixed fields and what it has produced so far.
class ResponseBuilder {
 public:
  ResponseBuilder(Endpoint endpoint, std::string id, std::string model, int64_t created,
                  const io::Tokenizer* tokenizer, bool logprobs);
  // Adds an Output's text, ids and logprobs to the whole answer.
  void add(const Output& o);
  // The streamed chunk for one Output (null when it carries nothing to send and is not final).
  nlohmann::json chunk(const Output& o);
  // The first chat chunk ({"role": "assistant", "content": ""}).
  nlohmann::json role_chunk() const;
  // The chunk carrying only usage (stream_options.include_usage).
  nlohmann::json usage_chunk(const nlohmann::json& usage) const;
  // The whole answer once the final Output was added.
  nlohmann::json whole(const nlohmann::json& usage) const;

  const Output& last() const { return last_; }

 private:
  nlohmann::json logprobs_json(const std::vector<int64_t>& ids,
                               const std::vector<TokenLogprob>& chosen,
                               const std::vector<std::vector<TokenLogprob>>& top,
                               int64_t& text_offset) const;
  nlohmann::json head(const char* object) const;
  std::string token_text(int64_t id) const;

  Endpoint endpoint_;
  std::string id_, model_;
  int64_t created_;
  const io::Tokenizer* tok_;
  bool logprobs_;
  std::string text_;
  std::vector<int64_t> ids_;
  std::vector<TokenLogprob> chosen_;
  std::vector<std::vector<TokenLogprob>> top_;
  int64_t stream_offset_ = 0;  // completions' text_offset of the next streamed token
  Output last_;
};

// s with each byte that is not part of valid UTF-8 replaced by U+FFFD (JSON carries only valid
// UTF-8; a model's ids can decode to any bytes).
std::string valid_utf8(const std::string& s);

// usage: prompt, completion and total tokens, prompt_tokens_details.cached_tokens.
nlohmann::json usage_json(const Output& final_output);

}  // namespace nxd::inference::server

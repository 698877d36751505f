// OpenAI response bodies (inference/server/openai_response.h).
#include "nxd/inference/server/openai_response.h"

#include "nxd/io/tokenizer.h"

namespace nxd::inference::server {
namespace {
using json = nlohmann::json;

json finish_json(FinishReason f) {
  if (f == FinishReason::none) return nullptr;
  return openai_finish_reason(f);
}

// A token's text for logprobs: its bytes may be part of a character, so invalid UTF-8 is cut
// into "bytes:\xNN" pieces as OpenAI does.
std::string printable(const std::string& s) {
  if (invalid_utf8_at(s) == std::string::npos) return s;
  std::string out;
  for (unsigned char c : s) {
    char buf[12];
    std::snprintf(buf, sizeof buf, c < 0x80 ? "%c" : "bytes:\\x%02x", c);
    out += buf;
  }
  return out;
}

std::vector<int> bytes_of(const std::string& s) {
  std::vector<int> out;
  for (unsigned char c : s) out.push_back(c);
  return out;
}

}  // namespace

ResponseBuilder::ResponseBuilder(Endpoint endpoint, std::string id, std::string model,
                                 int64_t created, const io::Tokenizer* tokenizer, bool logprobs)
    : endpoint_(endpoint),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      tok_(tokenizer),
      logprobs_(logprobs) {}

std::string ResponseBuilder::token_text(int64_t id) const {
  if (!tok_) return "token_id:" + std::to_string(id);
  int64_t left_out = 0;
  return tok_->decode_model_output({id}, left_out);
}

json ResponseBuilder::head(const char* object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

json ResponseBuilder::logprobs_json(const std::vector<int64_t>& ids,
                                    const std::vector<TokenLogprob>& chosen,
                                    const std::vector<std::vector<TokenLogprob>>& top,
                                    int64_t& text_offset) const {
  if (!logprobs_) return nullptr;
  const size_t n = std::min(ids.size(), chosen.size());
  if (endpoint_ == Endpoint::chat) {
    json content = json::array();
    for (size_t i = 0; i < n; ++i) {
      const std::string t = token_text(ids[i]);
      json alts = json::array();
      if (i < top.size())
        for (const TokenLogprob& a : top[i]) {
          const std::string at = token_text(a.id);
          alts.push_back(
              {{"token", printable(at)}, {"logprob", a.logprob}, {"bytes", bytes_of(at)}});
        }
      content.push_back({{"token", printable(t)},
                         {"logprob", chosen[i].logprob},
                         {"bytes", bytes_of(t)},
                         {"top_logprobs", alts}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (size_t i = 0; i < n; ++i) {
    const std::string t = token_text(ids[i]);
    tokens.push_back(printable(t));
    lps.push_back(chosen[i].logprob);
    json alts = json::object();
    if (i < top.size())
      for (const TokenLogprob& a : top[i]) alts[printable(token_text(a.id))] = a.logprob;
    tops.push_back(alts);
    offs.push_back(text_offset);
    text_offset += static_cast<int64_t>(t.size());
  }
  return {
      {"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

std::string valid_utf8(const std::string& s) {
  std::string out;
  size_t at = 0;
  while (at < s.size()) {
    const size_t bad = invalid_utf8_at(s.substr(at));
    if (bad == std::string::npos) {
      out.append(s, at, std::string::npos);
      break;
    }
    out.append(s, at, bad);
    out += "\xEF\xBF\xBD";
    at += bad + 1;
  }
  return out;
}

void ResponseBuilder::add(const Output& o) {
  text_ += valid_utf8(o.text);
  ids_.insert(ids_.end(), o.ids.begin(), o.ids.end());
  chosen_.insert(chosen_.end(), o.chosen.begin(), o.chosen.end());
  top_.insert(top_.end(), o.top.begin(), o.top.end());
  last_ = o;
}

json ResponseBuilder::chunk(const Output& o) {
  const bool final = o.finish != FinishReason::none;
  if (o.text.empty() && o.ids.empty() && !final) return nullptr;
  json lp = logprobs_json(o.ids, o.chosen, o.top, stream_offset_);
  if (endpoint_ == Endpoint::chat) {
    json delta = json::object();
    if (!o.text.empty() || !final) delta["content"] = valid_utf8(o.text);
    json c = head("chat.completion.chunk");
    c["choices"] = json::array({{{"index", 0},
                                 {"delta", delta},
                                 {"logprobs", lp},
                                 {"finish_reason", finish_json(o.finish)}}});
    return c;
  }
  json c = head("text_completion");
  c["choices"] = json::array({{{"index", 0},
                               {"text", valid_utf8(o.text)},
                               {"logprobs", lp},
                               {"finish_reason", finish_json(o.finish)}}});
  return c;
}

json ResponseBuilder::role_chunk() const {
  json c = head("chat.completion.chunk");
  c["choices"] = json::array({{{"index", 0},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  return c;
}

json ResponseBuilder::usage_chunk(const json& usage) const {
  json c = head(endpoint_ == Endpoint::chat ? "chat.completion.chunk" : "text_completion");
  c["choices"] = json::array();
  c["usage"] = usage;
  return c;
}

json ResponseBuilder::whole(const json& usage) const {
  int64_t offset = 0;
  json lp = logprobs_json(ids_, chosen_, top_, offset);
  json r;
  if (endpoint_ == Endpoint::chat) {
    r = head("chat.completion");
    r["choices"] = json::array({{{"index", 0},
                                 {"message", {{"role", "assistant"}, {"content", text_}}},
                                 {"logprobs", lp},
                                 {"finish_reason", finish_json(last_.finish)}}});
  } else {
    r = head("text_completion");
    r["choices"] = json::array({{{"index", 0},
                                 {"text", text_},
                                 {"logprobs", lp},
                                 {"finish_reason", finish_json(last_.finish)}}});
  }
  r["usage"] = usage;
  return r;
}

json usage_json(const Output& o) {
  return {{"prompt_tokens", o.prompt_tokens},
          {"completion_tokens", o.completion_tokens},
          {"total_tokens", o.prompt_tokens + o.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", o.cached_prompt_tokens}}}};
}

}  // namespace nxd::inference::server

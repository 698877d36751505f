// Checking OpenAI request bodies (inference/server/openai_request.h).
#include "nxd/inference/server/openai_request.h"

#include <cmath>

#include "nxd/io/bounded_read.h"
#include "nxd/io/chat_template.h"
#include "nxd/io/tokenizer.h"
#include "nxd/runtime/error.h"

namespace nxd::inference::server {
namespace {
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr int kMaxStops = 16;
constexpr int64_t kMaxTopLogprobs = 20;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, param, message);
}

std::string shown(const ojson& v) {
  return io::shorten(v.dump());
}

bool get_bool(const ojson& b, const char* key, bool dflt) {
  if (!b.contains(key) || b[key].is_null()) return dflt;
  if (!b[key].is_boolean()) bad(key, str(key, " must be true or false, got ", shown(b[key])));
  return b[key].get<bool>();
}

double get_number(const ojson& b, const char* key, double lo, double hi, double dflt,
                  bool open_low = false) {
  if (!b.contains(key) || b[key].is_null()) return dflt;
  const ojson& v = b[key];
  const double x = v.is_number() ? v.get<double>() : NAN;
  const bool ok = v.is_number() && std::isfinite(x) && (open_low ? x > lo : x >= lo) && x <= hi;
  if (!ok)
    bad(key,
        str(key, " must be a number in ", open_low ? "(" : "[", lo, ", ", hi, "], got ", shown(v)));
  return x;
}

int64_t get_int(const ojson& b, const char* key, int64_t lo, int64_t hi, int64_t dflt) {
  if (!b.contains(key) || b[key].is_null()) return dflt;
  const ojson& v = b[key];
  const bool integral =
      v.is_number_integer() ||
      (v.is_number_float() && std::isfinite(v.get<double>()) &&
       v.get<double>() == std::floor(v.get<double>()) && std::fabs(v.get<double>()) < 9e15);
  if (!integral) bad(key, str(key, " must be an integer in [", lo, ", ", hi, "], got ", shown(v)));
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                        ? INT64_MAX
                        : v.get<int64_t>();
  if (x < lo || x > hi)
    bad(key, str(key, " must be an integer in [", lo, ", ", hi, "], got ", shown(v)));
  return x;
}

std::vector<int64_t> token_ids(const ojson& list, const char* key, const RequestLimits& lim) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < list.size(); ++i) {
    const ojson& v = list[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= lim.vocab_size)
      bad(key,
          str(key, "[", i, "] must be a token id in [0, ", lim.vocab_size, "), got ", shown(v)));
    ids.push_back(v.get<int64_t>());
  }
  return ids;
}

std::vector<int64_t> encode(const std::string& text, const char* key, const RequestLimits& lim) {
  if (!lim.tokenizer)
    bad(key, str(key, " is text but this server has no tokenizer: send token ids"));
  std::vector<int64_t> ids;
  try {
    ids = lim.tokenizer->encode(text);
  } catch (const UserError& e) {
    bad(key, str(key, " cannot be tokenized: ", io::one_line(e.what())));
  }
  for (int64_t id : ids)
    if (id >= lim.vocab_size)
      bad(key, str(key, " gives token id ", id, ", past the model's vocab_size ", lim.vocab_size));
  return ids;
}

std::vector<int64_t> completion_prompt(const ojson& b, const RequestLimits& lim) {
  if (!b.contains("prompt")) bad("prompt", "prompt is required");
  const ojson& p = b["prompt"];
  if (p.is_string()) return encode(p.get<std::string>(), "prompt", lim);
  if (p.is_array() && p.size() == 1 && p[0].is_string())
    return encode(p[0].get<std::string>(), "prompt", lim);
  if (p.is_array() && !p.empty() && p[0].is_number()) return token_ids(p, "prompt", lim);
  if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array()))
    bad("prompt", str("prompt: one prompt per request (got a list of ", p.size(), ")"));
  bad("prompt", str("prompt must be a string or a list of token ids, got ", shown(p)));
}

// The messages as the chat template's input: content parts joined into one string.
ojson chat_messages(const ojson& b) {
  if (!b.contains("messages")) bad("messages", "messages is required");
  const ojson& list = b["messages"];
  if (!list.is_array() || list.empty())
    bad("messages", str("messages must be a non-empty list, got ", shown(list)));
  ojson out = ojson::array();
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = str("messages[", i, "]");
    const ojson& m = list[i];
    if (!m.is_object()) bad(at, str(at, " must be an object, got ", shown(m)));
    if (!m.contains("role") || !m["role"].is_string())
      bad(at + ".role", str(at, ".role must be a string"));
    ojson msg = m;
    if (!m.contains("content") || m["content"].is_null()) {
      msg["content"] = "";
    } else if (m["content"].is_array()) {
      std::string text;
      for (size_t k = 0; k < m["content"].size(); ++k) {
        const ojson& part = m["content"][k];
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          bad(str(at, ".content[", k, "]"),
              str(at, ".content[", k,
                  "]: only {\"type\": \"text\", \"text\": ...} parts are "
                  "supported, got ",
                  shown(part)));
        text += part["text"].get<std::string>();
      }
      msg["content"] = text;
    } else if (!m["content"].is_string()) {
      bad(at + ".content", str(at, ".content must be a string or a list of text parts"));
    }
    out.push_back(std::move(msg));
  }
  return out;
}

std::vector<int64_t> chat_prompt(const ojson& b, const RequestLimits& lim) {
  if (!lim.chat_template)
    bad("messages",
        "this model has no chat template (tokenizer_config.json's chat_template): use "
        "/v1/completions");
  io::ChatRenderOptions opts;
  if (b.contains("tools") && !b["tools"].is_null()) {
    if (!b["tools"].is_array()) bad("tools", "tools must be a list");
    opts.extra["tools"] = b["tools"];
  }
  std::string text;
  try {
    text = lim.chat_template->render(chat_messages(b), opts);
  } catch (const InvalidArgument& e) {  // raise_exception in the template, or a bad value
    bad("messages", io::one_line(e.what()));
  }
  return encode(text, "messages", lim);
}

void stops(const ojson& b, Request& r, const RequestLimits& lim) {
  if (b.contains("stop") && !b["stop"].is_null()) {
    const ojson& s = b["stop"];
    std::vector<std::string> list;
    if (s.is_string()) {
      list.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= kMaxStops) {
      for (const ojson& x : s) {
        if (!x.is_string()) bad("stop", str("stop must hold strings, got ", shown(x)));
        list.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", str("stop must be a string or a list of at most ", kMaxStops, " strings"));
    }
    for (const auto& x : list)
      if (x.empty()) bad("stop", "stop strings must not be empty");
    if (!list.empty() && !lim.tokenizer)
      bad("stop", "stop strings need a tokenizer; this server has none");
    r.stop.stop = std::move(list);
  }
  if (b.contains("stop_token_ids") && !b["stop_token_ids"].is_null()) {
    if (!b["stop_token_ids"].is_array()) bad("stop_token_ids", "stop_token_ids must be a list");
    r.stop.stop_token_ids = token_ids(b["stop_token_ids"], "stop_token_ids", lim);
  }
  r.stop.ignore_eos = get_bool(b, "ignore_eos", false);
}

void sampling(const ojson& b, Request& r, const RequestLimits& lim) {
  SamplingParams& s = r.sampling;
  s.temperature = get_number(b, "temperature", 0, 2, 1.0);
  s.top_p = get_number(b, "top_p", 0, 1, 1.0, /*open_low=*/true);
  s.top_k = get_int(b, "top_k", -1, lim.vocab_size, 0);
  if (s.top_k < 0) s.top_k = 0;  // vLLM: -1 is off
  s.min_p = get_number(b, "min_p", 0, 1, 0.0);
  s.presence_penalty = get_number(b, "presence_penalty", -2, 2, 0.0);
  s.frequency_penalty = get_number(b, "frequency_penalty", -2, 2, 0.0);
  s.repetition_penalty = get_number(b, "repetition_penalty", 0, 100, 1.0, /*open_low=*/true);
  s.seed = static_cast<uint64_t>(get_int(b, "seed", INT64_MIN, INT64_MAX, 0));
  if (get_int(b, "n", 1, 1, 1) != 1) bad("n", "n must be 1");
  if (b.contains("logit_bias") && !b["logit_bias"].is_null() &&
      !(b["logit_bias"].is_object() && b["logit_bias"].empty()))
    bad("logit_bias", "logit_bias is not supported");
}

}  // namespace

ApiError::ApiError(int status_, std::string param_, const std::string& message, std::string type_,
                   std::string code_)
    : std::runtime_error(message),
      status(status_),
      param(std::move(param_)),
      type(std::move(type_)),
      code(std::move(code_)) {}

nlohmann::json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.what()},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

size_t invalid_utf8_at(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80)
      len = 1, cp = c;
    else if ((c & 0xE0) == 0xC0)
      len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
      len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
      len = 4, cp = c & 0x07, min = 0x10000;
    else
      return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (len > 1 && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) return i;
    i += len;
  }
  return std::string::npos;
}

ParsedRequest parse_request(Endpoint endpoint, const std::string& body, const RequestLimits& lim) {
  if (const size_t at = invalid_utf8_at(body); at != std::string::npos) {
    // name the field: the last "key": before the bad byte
    std::string param = "body";
    const size_t colon = body.rfind("\":", at);
    if (colon != std::string::npos) {
      const size_t open = body.rfind('"', colon - 1);
      if (open != std::string::npos) param = body.substr(open + 1, colon - open - 1);
    }
    bad(param,
        str("the request is not valid UTF-8: byte ", at, " (in ", io::shorten(param, 40), ")"));
  }
  try {  // a parser recurses once per level: refuse deep nesting first
    io::check_flow_depth(body, /*yaml=*/false, "the request body", "nxd-serve");
  } catch (const ConfigError& e) {
    bad("body", io::one_line(e.what()));
  }
  ojson b;
  try {
    b = ojson::parse(body);
  } catch (const ojson::parse_error& e) {
    bad("body", str("malformed JSON: ", e.what()));
  }
  if (!b.is_object()) bad("body", "the request body must be a JSON object");
  if (b.contains("model")) {
    if (!b["model"].is_string()) bad("model", "model must be a string");
    if (b["model"].get<std::string>() != lim.served_model_name)
      throw ApiError(404, "model",
                     str("The model '", io::shorten(b["model"].get<std::string>()),
                         "' does not exist (this server serves '", lim.served_model_name, "')"),
                     "invalid_request_error", "model_not_found");
  }
  ParsedRequest p;
  p.endpoint = endpoint;
  p.stream = get_bool(b, "stream", false);
  if (b.contains("stream_options") && !b["stream_options"].is_null()) {
    if (!b["stream_options"].is_object()) bad("stream_options", "stream_options must be an object");
    p.include_usage = get_bool(b["stream_options"], "include_usage", false);
  }
  Request& r = p.request;
  sampling(b, r, lim);
  stops(b, r, lim);
  const char* prompt_key = endpoint == Endpoint::chat ? "messages" : "prompt";
  if (endpoint == Endpoint::completions) {
    r.prompt = completion_prompt(b, lim);
    const int64_t lp = get_int(b, "logprobs", 0, kMaxTopLogprobs, -1);
    p.logprobs = lp >= 0;
    p.top_logprobs = std::max<int64_t>(lp, 0);
    if (get_bool(b, "echo", false)) bad("echo", "echo is not supported");
    if (get_int(b, "best_of", 1, 1, 1) != 1) bad("best_of", "best_of must be 1");
    if (b.contains("suffix") && !b["suffix"].is_null()) bad("suffix", "suffix is not supported");
  } else {
    r.prompt = chat_prompt(b, lim);
    p.logprobs = get_bool(b, "logprobs", false);
    p.top_logprobs = get_int(b, "top_logprobs", 0, kMaxTopLogprobs, 0);
    if (p.top_logprobs > 0 && !p.logprobs) bad("top_logprobs", "top_logprobs needs logprobs: true");
  }
  r.sampling.logprobs = p.logprobs ? p.top_logprobs : -1;
  const auto n = static_cast<int64_t>(r.prompt.size());
  if (n == 0) bad(prompt_key, str(prompt_key, " gives no tokens"));
  if (n >= lim.max_model_len)
    bad(prompt_key,
        str("This model's maximum context length is ", lim.max_model_len, " tokens; the ",
            prompt_key, " has ", n, " tokens, which leaves no room for a completion"));
  const int64_t room = lim.max_model_len - n;
  const char* max_key = endpoint == Endpoint::chat && b.contains("max_completion_tokens")
                            ? "max_completion_tokens"
                            : "max_tokens";
  r.stop.max_tokens =
      get_int(b, max_key, 1, room, endpoint == Endpoint::chat ? room : std::min<int64_t>(16, room));
  return p;
}

}  // namespace nxd::inference::server

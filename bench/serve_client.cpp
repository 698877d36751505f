#include "serve_client.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

namespace nxd::bench::serve {

using nlohmann::json;

double steady_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

namespace {

// One server-sent event's data (after "data: "), into r.
void take_event(const std::string& data, StreamResult& r, int64_t& text_events) {
  if (data == "[DONE]") return;
  const json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return;
  if (j.contains("error")) {
    r.error = data;
    return;
  }
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    const json& c = j["choices"][0];
    if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty()) {
      const double t = steady_seconds();
      if (r.token_times.empty()) r.ttft = t - r.sent;
      r.token_times.push_back(t);
      ++text_events;
    }
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const json& u = j["usage"];
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
      r.tokens = u["completion_tokens"].get<int64_t>();
    if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object() &&
        u["prompt_tokens_details"].contains("cached_tokens"))
      r.cached_tokens = u["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  }
}

}  // namespace

StreamResult stream_completion(const Endpoint& at, const std::vector<int64_t>& prompt,
                               int64_t max_tokens, const StreamHooks& hooks) {
  StreamResult r;
  const json body = {{"prompt", prompt}, {"max_tokens", max_tokens},
                     {"temperature", 0}, {"ignore_eos", true},
                     {"stream", true},   {"stream_options", {{"include_usage", true}}}};
  httplib::Client cli(at.host, at.port);
  cli.set_connection_timeout(10);
  cli.set_read_timeout(600);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string buf, raw;
  int64_t text_events = 0;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    buf.append(d, n);
    if (raw.size() < 4096) raw.append(d, std::min<size_t>(n, 4096));
    size_t end;
    while ((end = buf.find("\n\n")) != std::string::npos) {
      std::istringstream ev(buf.substr(0, end));
      buf.erase(0, end + 2);
      for (std::string line; std::getline(ev, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.rfind("data: ", 0) == 0) take_event(line.substr(6), r, text_events);
      }
    }
    if (hooks.progress) hooks.progress->store(text_events);
    return !(hooks.stop && hooks.stop->load());
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  r.sent = steady_seconds();
  const bool sent = cli.send(req, res, err);
  if (hooks.stop && hooks.stop->load() && !r.token_times.empty()) {  // closed by us
    r.tokens = text_events;
    r.ok = true;
    return r;
  }
  if (!sent) {
    r.error = "no response: " + httplib::to_string(err);
    return r;
  }
  if (res.status != 200) {
    r.error = "HTTP " + std::to_string(res.status) + ": " + raw;
    return r;
  }
  if (r.tokens == 0) r.tokens = text_events;
  r.ok = r.error.empty() && !r.token_times.empty();
  if (!r.ok && r.error.empty()) r.error = "no tokens in the stream: " + raw;
  return r;
}

std::string get_text(const Endpoint& at, const std::string& path) {
  httplib::Client c(at.host, at.port);
  c.set_read_timeout(30);
  auto r = c.Get(path.c_str());
  return r && r->status == 200 ? r->body : std::string();
}

double metric_value(const std::string& metrics, const std::string& name) {
  std::istringstream in(metrics);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  return -1;
}

std::vector<int64_t> random_ids(std::mt19937_64& rng, int64_t n, int64_t first_id, int64_t vocab) {
  std::uniform_int_distribution<int64_t> id(first_id, vocab - 1);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = id(rng);
  return v;
}

std::vector<std::vector<int64_t>> request_mix(int64_t count, int64_t lo, int64_t hi,
                                              int64_t first_id, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(std::log(double(lo)), std::log(double(hi)));
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < count; ++i) {
    const auto n = std::clamp<int64_t>(std::llround(std::exp(u(rng))), lo, hi);
    out.push_back(random_ids(rng, n, first_id, vocab));
  }
  return out;
}

}  // namespace nxd::bench::serve

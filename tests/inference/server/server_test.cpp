// nxd-serve's server (inference/server/server.h) through real HTTP on 127.0.0.1 with
// httplib::Client: completions and chat, streaming and not, equal the engine's own greedy result
// (which equals CausalLM::generate_batch); every error path answers its status with OpenAI's
// error object naming the field; 64 concurrent clients; a client that leaves mid-stream or while
// waiting is cancelled and its KV blocks freed; a full queue answers 429; the graceful stop.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nxd/inference/server/openai_response.h"
#include "serve_fixture.h"

using namespace nxd;
using namespace nxd::testing;
using json = nlohmann::json;

namespace {

// What the engine itself gives for `prompt` (greedy): ids and text, in a fresh engine.
struct Direct {
  std::vector<int64_t> ids;
  std::string text;
  inference::FinishReason finish = inference::FinishReason::none;
};
Direct direct(const Served& s, const std::vector<int64_t>& prompt, int64_t max_tokens) {
  inference::Engine e(s.model, s.tok, {});
  inference::Request r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.stop.max_tokens = max_tokens;
  Direct d;
  e.submit(r, [&d](const inference::Output& o) {
    d.ids.insert(d.ids.end(), o.ids.begin(), o.ids.end());
    d.text += o.text;
    if (o.finish != inference::FinishReason::none) d.finish = o.finish;
  });
  e.run_until_idle();
  d.text = inference::server::valid_utf8(d.text);  // as JSON carries it
  // ... and the engine's tokens are CausalLM::generate_batch's
  GenerateOptions g;
  g.max_new_tokens = max_tokens;
  g.temperature = 0;
  std::vector<int64_t> seq = prompt;
  seq.insert(seq.end(), d.ids.begin(), d.ids.end());
  EXPECT_EQ(s.model->generate_batch({prompt}, g).sequences.at(0), seq);
  return d;
}

std::vector<int64_t> chat_ids(const Served& s, const json& messages) {
  return s.tok->encode(s.tpl->render(messages));
}

// The streamed text and the last chunk's finish_reason; checks the stream's shape.
std::pair<std::string, std::string> streamed(const std::string& body, bool chat) {
  const auto events = sse_data(body);
  EXPECT_GE(events.size(), 2u) << body;
  if (events.empty()) return {};
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text, finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], chat ? "chat.completion.chunk" : "text_completion");
    if (c["choices"].empty()) continue;  // the usage chunk
    const json& ch = c["choices"][0];
    if (chat) {
      if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
    } else {
      text += ch["text"].get<std::string>();
    }
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  return {text, finish};
}

// Waits (at most 10 s) until the engine has no request and no block in use.
void expect_engine_drains(const Served& s) {
  for (int i = 0; i < 200; ++i) {
    const auto st = s.engine->stats();
    if (st.kv_blocks_used == 0 && st.running == 0 && st.waiting == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto st = s.engine->stats();
  ADD_FAILURE() << "engine still busy: running " << st.running << ", waiting " << st.waiting
                << ", KV blocks " << st.kv_blocks_used;
}

TEST(Serve, CompletionsEqualTheEnginesGreedyTokensStreamingOrNot) {
  Served s;
  auto c = s.client();
  const std::string prompt = "the cat sat on the mat";
  const auto ids = s.tok->encode(prompt);
  const Direct want = direct(s, ids, 12);
  ASSERT_EQ(want.ids.size(), 12u);
  const json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}};
  Reply r = post(c, "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["object"], "text_completion");
  EXPECT_EQ(r.json["model"], "tiny");
  EXPECT_EQ(r.json["choices"][0]["text"], want.text);
  EXPECT_EQ(r.json["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r.json["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(r.json["usage"]["completion_tokens"], 12);
  EXPECT_EQ(r.json["usage"]["total_tokens"], ids.size() + 12);
  // the same prompt as token ids, with logprobs
  json by_ids = body;
  by_ids["prompt"] = ids;
  by_ids["logprobs"] = 2;
  r = post(c, "/v1/completions", by_ids.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["choices"][0]["text"], want.text);
  const json& lp = r.json["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_LE(lp["top_logprobs"][i].size(), 2u);
    EXPECT_GE(lp["top_logprobs"][i].size(), 1u);
  }
  // streaming, with the usage chunk
  json st = body;
  st["stream"] = true;
  st["stream_options"] = {{"include_usage", true}};
  r = post(c, "/v1/completions", st.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const auto [text, finish] = streamed(r.body, false);
  EXPECT_EQ(text, want.text);
  EXPECT_EQ(finish, "length");
  const auto events = sse_data(r.body);
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 12);
  // the prompt again: the same text
  r = post(c, "/v1/completions", body.dump());
  EXPECT_EQ(r.json["choices"][0]["text"], want.text);
}

TEST(Serve, StopStringsPrefixCacheAndChatLogprobs) {
  Served s;
  auto c = s.client();
  // a stop string taken from the greedy text ends the answer before it
  const std::string prompt = "the cat sat on the mat";
  const Direct want = direct(s, s.tok->encode(prompt), 12);
  size_t k = 2;
  while (k + 1 < want.text.size() && !(std::isalpha(static_cast<unsigned char>(want.text[k])) &&
                                       std::isalpha(static_cast<unsigned char>(want.text[k + 1]))))
    ++k;
  ASSERT_LT(k + 1, want.text.size()) << "no two letters in: " << want.text;
  const std::string stop = want.text.substr(k, 2);
  const size_t first = want.text.find(stop);
  Reply r =
      post(c, "/v1/completions",
           json{{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"stop", stop}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["choices"][0]["text"], inference::server::valid_utf8(want.text.substr(0, first)))
      << "stop " << stop;
  EXPECT_EQ(r.json["choices"][0]["finish_reason"], "stop");
  // a 40-token prompt twice: the second finds its two full 16-position blocks cached
  std::vector<int64_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(100 + i);
  const json again = {{"prompt", ids}, {"max_tokens", 2}};
  EXPECT_EQ(post(c, "/v1/completions", again.dump())
                .json["usage"]["prompt_tokens_details"]["cached_tokens"],
            0);
  r = post(c, "/v1/completions", again.dump());
  EXPECT_EQ(r.json["usage"]["prompt_tokens_details"]["cached_tokens"], 32) << r.body;
  // sampling with a seed: the same request gives the same text; another seed another text
  const auto sampled = [&](int seed) {
    return post(c, "/v1/completions",
                json{{"prompt", prompt},
                     {"max_tokens", 12},
                     {"temperature", 1.5},
                     {"top_k", 40},
                     {"seed", seed}}
                    .dump())
        .json["choices"][0]["text"];
  };
  EXPECT_EQ(sampled(7), sampled(7));
  EXPECT_NE(sampled(7), sampled(8));
  // chat logprobs: per token its text, logprob, bytes and the two most likely
  r = post(c, "/v1/chat/completions",
           json{{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                {"max_tokens", 5},
                {"logprobs", true},
                {"top_logprobs", 2}}
               .dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json& content = r.json["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 5u) << r.body;
  for (const json& t : content) {
    EXPECT_TRUE(t["token"].is_string());
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    EXPECT_FALSE(t["bytes"].empty());
    ASSERT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(),
              t["top_logprobs"][1]["logprob"].get<double>());
  }
}

TEST(Serve, ChatUsesTheTemplateStreamingOrNot) {
  Served s;
  auto c = s.client();
  const json messages = {{{"role", "system"}, {"content", "You are terse."}},
                         {{"role", "user"}, {"content", "the dog ran"}}};
  const auto ids = chat_ids(s, messages);
  EXPECT_EQ(ids.front(), s.tok->encode("<|im_start|>").at(0)) << "special tokens tokenize whole";
  const Direct want = direct(s, ids, 10);
  json body = {{"model", "tiny"}, {"messages", messages}, {"max_tokens", 10}, {"temperature", 0}};
  Reply r = post(c, "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["object"], "chat.completion");
  EXPECT_EQ(r.json["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r.json["choices"][0]["message"]["content"], want.text);
  EXPECT_EQ(r.json["usage"]["prompt_tokens"], ids.size());
  // content as a list of text parts, streaming
  body["messages"][1]["content"] =
      json::array({{{"type", "text"}, {"text", "the dog"}}, {{"type", "text"}, {"text", " ran"}}});
  body["stream"] = true;
  r = post(c, "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const auto events = sse_data(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(json::parse(events[0])["choices"][0]["delta"]["role"], "assistant");
  const auto [text, finish] = streamed(r.body, true);
  EXPECT_EQ(text, want.text);
  EXPECT_EQ(finish, "length");
  // the default max_tokens is the rest of the context
  body.erase("max_tokens");
  body["stream"] = false;
  r = post(c, "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["usage"]["total_tokens"], 64);
}

TEST(Serve, ModelsHealthAndMetrics) {
  Served s;
  auto c = s.client();
  Reply r = get(c, "/v1/models");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.json["data"][0]["id"], "tiny");
  EXPECT_EQ(r.json["data"][0]["max_model_len"], 64);
  r = get(c, "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.json["status"], "ok");
  EXPECT_EQ(post(c, "/v1/completions", R"({"prompt": "a b c", "max_tokens": 5})").status, 200);
  EXPECT_EQ(post(c, "/v1/completions", R"({"prompt": "a b c", "max_tokens": 5})").status, 200);
  expect_engine_drains(s);  // the engine's figures are updated after a step's outputs are sent
  r = get(c, "/metrics");
  ASSERT_EQ(r.status, 200);
  for (const char* name :
       {"nxd_serve_queue_length 0", "nxd_serve_requests_running 0", "nxd_serve_requests_waiting 0",
        "nxd_serve_kv_blocks_used 0", "nxd_serve_prefix_cache_hit_rate ",
        "nxd_serve_tokens_per_second ", "nxd_serve_generation_tokens_total 10",
        "nxd_serve_time_to_first_token_seconds_count 2", "nxd_serve_model_calls_total ",
        "nxd_serve_inter_token_latency_seconds_count 8",
        "nxd_serve_requests_finished_total{finish_reason=\"length\"} 2",
        "nxd_serve_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2"})
    EXPECT_NE(r.body.find(name), std::string::npos) << name << "\n" << r.body;
}

struct BadCase {
  std::string path, body;
  int status;
  std::string param, says;
};

TEST(Serve, BadInputIsA4xxNamingTheFieldAndTheServerCarriesOn) {
  ServeOptions o;
  o.server.max_body_bytes = 4096;
  Served s(o);
  auto c = s.client();
  std::string long_prompt;  // over 64 tokens
  for (int i = 0; i < 100; ++i) long_prompt += "a b ";
  const std::vector<BadCase> cases = {
      {"/v1/completions", "{\"prompt\": \"a\",", 400, "body", "malformed JSON"},
      {"/v1/completions", "[1, 2]", 400, "body", "must be a JSON object"},
      {"/v1/completions", std::string(1000, '[') + std::string(1000, ']'), 400, "body", "nested"},
      {"/v1/completions", R"({"model": "gpt-4", "prompt": "a"})", 404, "model", "gpt-4"},
      {"/v1/completions", R"({"prompt": ")" + long_prompt + R"("})", 400, "prompt",
       "maximum context length is 64"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 0})", 400, "max_tokens", "[1, 63]"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 64})", 400, "max_tokens", "got 64"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": "8"})", 400, "max_tokens", "\"8\""},
      {"/v1/completions", "{\"prompt\": \"caf\xC3\x28\"}", 400, "prompt", "not valid UTF-8"},
      {"/v1/completions", R"({"prompt": "a", "temperature": 3})", 400, "temperature", "[0, 2]"},
      {"/v1/completions", R"({"prompt": "a", "temperature": -0.5})", 400, "temperature", "-0.5"},
      {"/v1/completions", R"({"prompt": "a", "top_p": 0})", 400, "top_p", "(0, 1]"},
      {"/v1/completions", R"({"prompt": "a", "presence_penalty": 5})", 400, "presence_penalty", ""},
      {"/v1/completions", R"({"prompt": "a", "frequency_penalty": -3})", 400, "frequency_penalty",
       ""},
      {"/v1/completions", R"({"prompt": "a", "n": 2})", 400, "n", ""},
      {"/v1/completions", R"({"prompt": "a", "stop": 7})", 400, "stop", ""},
      {"/v1/completions", R"({"prompt": "a", "stop": [""]})", 400, "stop", "empty"},
      {"/v1/completions", R"({"prompt": "a", "logprobs": 50})", 400, "logprobs", "[0, 20]"},
      {"/v1/completions", R"({"prompt": "a", "stream": "yes"})", 400, "stream", "true or false"},
      {"/v1/completions", R"({"prompt": [1, 99999]})", 400, "prompt", "prompt[1]"},
      {"/v1/completions", R"({"prompt": ["a", "b"]})", 400, "prompt", "one prompt per request"},
      {"/v1/completions", R"({"max_tokens": 3})", 400, "prompt", "required"},
      {"/v1/completions", R"({"prompt": "a", "echo": true})", 400, "echo", ""},
      {"/v1/chat/completions", R"({"messages": []})", 400, "messages", "non-empty"},
      {"/v1/chat/completions", R"({"messages": [{"content": "hi"}]})", 400, "messages[0].role", ""},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": 5}]})", 400,
       "messages[0].content", ""},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", 400,
       "messages[0].content[0]", "text"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 3})", 400,
       "top_logprobs", "logprobs: true"},
      {"/v1/completions", std::string(5000, ' '), 413, "body", "over 4096 bytes"},
  };
  for (const BadCase& b : cases) {
    SCOPED_TRACE(b.path + " " + b.body.substr(0, 80));
    const Reply r = post(c, b.path, b.body);
    EXPECT_EQ(r.status, b.status) << r.body;
    ASSERT_TRUE(r.json.contains("error")) << r.body;
    const json& e = r.json["error"];
    EXPECT_EQ(e["param"], b.param) << r.body;
    EXPECT_TRUE(e["type"].is_string());
    EXPECT_NE(e["message"].get<std::string>().find(b.says), std::string::npos) << r.body;
  }
  const Reply unknown = get(c, "/v1/nothing");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_TRUE(unknown.json.contains("error")) << unknown.body;
  const Reply nf = post(c, "/v1/completions", R"({"model": "nope", "prompt": "a"})");
  EXPECT_EQ(nf.json["error"]["code"], "model_not_found");
  // after all that, a good request is answered
  const Reply ok = post(c, "/v1/completions", R"({"prompt": "a b", "max_tokens": 3})");
  EXPECT_EQ(ok.status, 200) << ok.body;
  const Reply m = get(c, "/metrics");
  EXPECT_NE(m.body.find("nxd_serve_http_errors_total{status=\"400\"}"), std::string::npos);
  EXPECT_NE(m.body.find("nxd_serve_http_errors_total{status=\"413\"}"), std::string::npos);
}

TEST(Serve, ApiKeyIsABearerToken) {
  ServeOptions o;
  o.server.api_key = "sekret";
  Served s(o);
  auto c = s.client();
  const std::string body = R"({"prompt": "a", "max_tokens": 2})";
  Reply r = post(c, "/v1/completions", body);
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.json["error"]["code"], "invalid_api_key");
  r = post(c, "/v1/completions", body, {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(get(c, "/v1/models").status, 401);
  r = post(c, "/v1/completions", body, {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(get(c, "/health").status, 200) << "health needs no key";
}

TEST(Serve, SixtyFourConcurrentClientsEachGetTheirOwnGreedyTokens) {
  ServeOptions o;
  o.engine.max_num_seqs = 16;
  Served s(o);
  constexpr int kClients = 64;
  std::vector<std::string> prompts;
  std::vector<Direct> want;
  for (int i = 0; i < kClients; ++i) {
    prompts.push_back("client " + std::to_string(i) + std::string(i % 7, '!') + " says hi");
    want.push_back(direct(s, s.tok->encode(prompts.back()), 6 + i % 5));
  }
  std::vector<std::future<std::string>> got;
  for (int i = 0; i < kClients; ++i)
    got.push_back(std::async(std::launch::async, [&, i] {
      auto c = s.client();
      const bool stream = i % 2 == 1;
      const json body = {{"prompt", prompts[i]},
                         {"max_tokens", 6 + i % 5},
                         {"temperature", 0},
                         {"stream", stream}};
      const Reply r = post(c, "/v1/completions", body.dump());
      if (r.status != 200) return "HTTP " + std::to_string(r.status) + " " + r.body;
      return stream ? streamed(r.body, false).first
                    : r.json["choices"][0]["text"].get<std::string>();
    }));
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(got[i].get(), want[i].text) << "client " << i;
  const auto st = s.engine->stats();
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.running + st.waiting, 0);
}

// A slower model (wider, deeper, 4096 positions: a few ms per token) so a long request is still
// running when its client goes away.
ServeOptions slow() {
  ServeOptions o;
  o.hidden = 256;
  o.layers = 8;
  o.positions = 4096;
  o.engine.kv_blocks = 600;
  return o;
}

std::string metric(httplib::Client& c, const std::string& name) {
  const std::string body = get(c, "/metrics").body;
  const size_t at = body.find("\n" + name + " ");
  if (at == std::string::npos) return "";
  const size_t b = at + name.size() + 2;
  return body.substr(b, body.find('\n', b) - b);
}

TEST(Serve, AClientThatLeavesMidStreamIsCancelledAndItsBlocksFreed) {
  Served s(slow());
  auto c = s.client();
  const json body = {{"prompt", "tell me a long story"}, {"max_tokens", 4000}, {"stream", true}};
  int chunks = 0;  // read three chunks, then hang up
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  EXPECT_FALSE(c.send(req, res, err)) << "the client hung up";
  EXPECT_GE(chunks, 3);
  expect_engine_drains(s);
  auto m = s.client();
  EXPECT_EQ(metric(m, "nxd_serve_requests_finished_total{finish_reason=\"cancelled\"}"), "1");
  const int64_t generated = std::stoll(metric(m, "nxd_serve_generation_tokens_total"));
  EXPECT_LT(generated, 4000) << "the cancelled request stopped early";
  // the server carries on
  EXPECT_EQ(post(c, "/v1/completions", R"({"prompt": "a", "max_tokens": 2})").status, 200);
}

// Sends an HTTP request on a raw socket, waits, and closes without reading the answer.
void send_and_hang_up(int port, const std::string& path, const std::string& body,
                      std::chrono::milliseconds after) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const std::string req =
      "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
      "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  std::this_thread::sleep_for(after);
  ::close(fd);
}

TEST(Serve, ANonStreamingClientThatGivesUpIsCancelled) {
  Served s(slow());
  send_and_hang_up(s.server->port(), "/v1/completions",
                   R"({"prompt": "a long one", "max_tokens": 4000})",
                   std::chrono::milliseconds(300));
  expect_engine_drains(s);
  auto m = s.client();
  EXPECT_EQ(metric(m, "nxd_serve_requests_finished_total{finish_reason=\"cancelled\"}"), "1");
}

TEST(Serve, AFullQueueAnswers429) {
  ServeOptions o = slow();
  o.engine.max_num_seqs = 1;
  o.engine.max_waiting = 1;
  Served s(o);
  std::vector<std::future<Reply>> replies;
  for (int i = 0; i < 6; ++i)
    replies.push_back(std::async(std::launch::async, [&] {
      auto c = s.client();
      return post(c, "/v1/completions", R"({"prompt": "busy busy", "max_tokens": 300})");
    }));
  int ok = 0, busy = 0;
  for (auto& f : replies) {
    const Reply r = f.get();
    if (r.status == 200) {
      ++ok;
    } else {
      EXPECT_EQ(r.status, 429) << r.body;
      EXPECT_EQ(r.json["error"]["type"], "rate_limit_exceeded") << r.body;
      ++busy;
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_GE(busy, 1) << "one running, one waiting: the others are refused";
  expect_engine_drains(s);
}

TEST(Serve, StopFinishesOrCancelsInFlightRequestsWithinTheGrace) {
  ServeOptions o = slow();
  o.server.shutdown_grace_s = 0.5;
  Served s(o);
  std::atomic<bool> got_done{false};
  std::string body_seen;
  std::thread client([&] {
    auto c = s.client();
    auto r = c.Post("/v1/completions",
                    R"({"prompt": "go on and on", "max_tokens": 4000, "stream": true})",
                    "application/json");
    if (r) {
      body_seen = r->body;
      got_done = r->body.find("data: [DONE]") != std::string::npos;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  std::thread second([&] { s.server->stop(); });  // two stops at once: one stops, one waits
  s.server->stop();
  second.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  client.join();
  EXPECT_LT(took, 0.5 + 2 + 3) << "grace, cancel wait, keep-alive bound";
  EXPECT_TRUE(got_done) << body_seen.substr(body_seen.size() > 300 ? body_seen.size() - 300 : 0);
  EXPECT_NE(body_seen.find("\"finish_reason\":\"cancelled\""), std::string::npos);
  httplib::Client late("127.0.0.1", s.server->port());
  late.set_connection_timeout(1);
  EXPECT_FALSE(late.Get("/health")) << "nothing listens after stop";
}

}  // namespace

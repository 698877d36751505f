#pragma once
// The server tests' pieces: a model folder (the tokenizer fixture's tokenizer.json with ChatML's
// two special tokens added, tokenizer_config.json with ChatML's template), a tiny Llama over that
// vocabulary, an engine and a started server on an ephemeral port of 127.0.0.1, and a few HTTP
// helpers (httplib::Client, server-sent events).
#include <gtest/gtest.h>
#include <httplib.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nxd/inference/engine.h"
#include "nxd/inference/server/server.h"
#include "nxd/io/chat_template.h"
#include "nxd/io/tokenizer.h"
#include "nxd/layers/models/causal_lm.h"
#include "support/files.h"
#include "support/tiny_models.h"

namespace nxd::testing {

inline const char* kChatML =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";

// dir/tokenizer.json (+ <|im_start|>, <|im_end|>) and dir/tokenizer_config.json (ChatML).
inline void write_model_folder(const std::filesystem::path& dir) {
  nlohmann::json t =
      nlohmann::json::parse(slurp(std::string(NXD_TOKENIZER_FIXTURES) + "/gpt2.tokenizer.json"));
  int64_t next = 0;
  for (const auto& a : t["added_tokens"])
    next = std::max<int64_t>(next, a["id"].get<int64_t>() + 1);
  for (const char* c : {"<|im_start|>", "<|im_end|>"})
    t["added_tokens"].push_back({{"id", next++},
                                 {"content", c},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
  std::ofstream(dir / "tokenizer.json") << t.dump();
  std::ofstream(dir / "tokenizer_config.json") << nlohmann::json{
      {"bos_token", nullptr},
      {"eos_token", "<|im_end|>"},
      {"chat_template", kChatML}}.dump();
}

struct ServeOptions {
  int64_t hidden = 32, layers = 2, positions = 64;
  inference::EngineOptions engine;
  inference::server::ServerOptions server;
};

// A tiny Llama over the fixture's vocabulary, its engine and a started server.
struct Served {
  ScratchDir dir{"nxd_serve_"};
  std::shared_ptr<const io::Tokenizer> tok;
  std::shared_ptr<const io::ChatTemplate> tpl;
  std::shared_ptr<CausalLM> model;
  std::unique_ptr<inference::Engine> engine;
  std::unique_ptr<inference::server::Server> server;

  explicit Served(ServeOptions o = {}) {
    std::signal(SIGPIPE, SIG_IGN);  // a client that closes early must not end the test binary
    write_model_folder(dir.path);
    tok = std::make_shared<const io::Tokenizer>(
        io::Tokenizer::from_file((dir.path / "tokenizer.json").string()));
    tpl =
        std::make_shared<const io::ChatTemplate>(io::ChatTemplate::from_folder(dir.path.string()));
    ModelConfig c = tiny_model("llama");
    c.vocab_size = tok->vocab_size();
    c.hidden_size = o.hidden;
    c.ffn_hidden_size = o.hidden * 3 / 2;
    c.num_layers = o.layers;
    c.max_position_embeddings = o.positions;
    model = make_causal_lm(c, 17);
    engine = std::make_unique<inference::Engine>(model, tok, o.engine);
    o.server.port = 0;
    o.server.served_model_name = "tiny";
    o.server.vocab_size = c.vocab_size;
    if (o.server.liveness_interval_s == 1) o.server.liveness_interval_s = 0.1;
    server = std::make_unique<inference::server::Server>(*engine, tok, tpl, o.server);
    server->start();
  }
  ~Served() { server->stop(); }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(60);
    c.set_write_timeout(10);
    return c;
  }
};

struct Reply {
  int status = 0;
  std::string body;
  nlohmann::json json;  // the body parsed (null when it is not JSON)
};

inline Reply reply_of(const httplib::Result& res) {
  Reply r;
  if (!res) {
    r.body = "no response: " + httplib::to_string(res.error());
    return r;
  }
  r.status = res->status;
  r.body = res->body;
  r.json = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  return r;
}

inline Reply post(httplib::Client& c, const std::string& path, const std::string& body,
                  const httplib::Headers& headers = {}) {
  return reply_of(c.Post(path.c_str(), headers, body, "application/json"));
}

inline Reply get(httplib::Client& c, const std::string& path,
                 const httplib::Headers& headers = {}) {
  return reply_of(c.Get(path.c_str(), headers));
}

// The `data:` payloads of a server-sent event stream ("[DONE]" included as text).
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < body.size()) {
    size_t end = body.find("\n\n", at);
    if (end == std::string::npos) end = body.size();
    const std::string ev = body.substr(at, end - at);
    if (ev.rfind("data: ", 0) == 0) out.push_back(ev.substr(6));
    at = end + 2;
  }
  return out;
}

}  // namespace nxd::testing

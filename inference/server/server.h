#pragma once
// nxd-serve's HTTP server: OpenAI's API over one inference Engine, on cpp-httplib
// (docs/design/serving.md).
//
//   POST /v1/completions, POST /v1/chat/completions   streaming (server-sent events: `data: {...}`
//                                                     chunks, then `data: [DONE]`) or not
//   GET /v1/models, GET /health, GET /metrics          (Prometheus text)
//
// The engine's loop runs on a thread of its own (Engine::run); each HTTP request runs on a
// worker thread that checks the body (openai_request.h), submits it and waits on its outputs.
// A streaming client that goes away is noticed at the next write, and its request is cancelled
// (its KV blocks freed); a non-streaming client is checked every `liveness_interval_s` once the
// answer takes longer than that. A full engine queue answers 429, a body over max_body_bytes 413,
// a missing or wrong bearer token 401 (when api_key is set), a draining server 503.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "nxd/inference/engine.h"
#include "nxd/layers/models/config.h"

namespace nxd::io {
class Tokenizer;
class ChatTemplate;
}  // namespace nxd::io

namespace nxd::inference::server {

// The modeled latency each response's usage carries (layers/models/inference_model.h).
struct ModeledLatency {
  ModelConfig model;
  std::string instance;  // inf2.xlarge, trn1.32xlarge, ...
  int tp = 1;
};

// Who runs the engine's loop (Engine::run): a thread the server starts, or the caller through
// Server::run_engine() — a TP engine's loop must run on its rank-0 thread.
enum class EngineLoop { own_thread, caller };

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;      // 0: any free port (port() says which)
  std::string api_key;  // empty: no authentication
  std::string served_model_name = "nxd";
  int64_t vocab_size = 0;  // the model's (> 0): token ids in requests must be below it
  int64_t max_body_bytes = 8 << 20;
  int http_threads = 128;          // each open request holds one while it waits
  double shutdown_grace_s = 10;    // stop(): in-flight requests get this long, then are cancelled
  double liveness_interval_s = 1;  // how often a waiting non-streaming answer checks its client
  std::optional<ModeledLatency> modeled;  // usage.modeled: TTFT and TPOT on an instance
  EngineLoop engine_loop = EngineLoop::own_thread;
};

class Server {
 public:
  // The engine, tokenizer and template must outlive the server. tokenizer may be null (token-id
  // prompts only), chat_template null (chat answers 400).
  Server(Engine& engine, std::shared_ptr<const io::Tokenizer> tokenizer,
         std::shared_ptr<const io::ChatTemplate> chat_template, ServerOptions opts);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (IoError naming them when it cannot) and starts the engine thread and the
  // HTTP threads; returns at once.
  void start();
  int port() const;
  // Graceful: new requests get 503, in-flight ones get shutdown_grace_s to finish and are then
  // cancelled; returns when every thread has ended. Idempotent; thread-safe.
  void stop();
  // Blocks until stop() has run (from another thread or a signal handler thread).
  void wait();
  // EngineLoop::caller: runs the engine's loop on this thread until stop() ends it.
  void run_engine();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace nxd::inference::server

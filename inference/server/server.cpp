// nxd-serve's HTTP server (inference/server/server.h): routes, the engine thread, each request's
// wait for its outputs, and the graceful stop.
#include "nxd/inference/server/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "nxd/inference/server/metrics.h"
#include "nxd/inference/server/openai_request.h"
#include "nxd/inference/server/openai_response.h"
#include "nxd/io/bounded_read.h"
#include "nxd/io/chat_template.h"
#include "nxd/io/tokenizer.h"
#include "nxd/layers/models/inference_model.h"
#include "nxd/runtime/error.h"

namespace nxd::inference::server {
namespace {
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// One request's outputs, passed from the engine thread to the HTTP thread that waits for them.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Output> outputs;
  bool finished = false;  // the final Output has been pushed
  // engine thread only
  Clock::time_point submitted = Clock::now(), last_token;
  bool first = true;

  void push(Output o) {
    std::lock_guard<std::mutex> g(mu);
    if (finished) return;
    finished = o.finish != FinishReason::none;
    outputs.push_back(std::move(o));
    cv.notify_all();
  }
  // What arrived, waiting at most `wait` for something.
  std::vector<Output> take(Seconds wait) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait_for(l, wait, [&] { return !outputs.empty(); });
    std::vector<Output> out(std::make_move_iterator(outputs.begin()),
                            std::make_move_iterator(outputs.end()));
    outputs.clear();
    return out;
  }
  bool done() {
    std::lock_guard<std::mutex> g(mu);
    return finished;
  }
};

// httplib listens with a backlog of 5: 64 clients connecting at once overflow it and some are
// dropped. Listening again on the bound socket widens it.
class HttpServer : public httplib::Server {
 public:
  void widen_backlog() { ::listen(svr_sock_, SOMAXCONN); }
};

Output final_output(FinishReason f, const std::string& error = "") {
  Output o;
  o.finish = f;
  o.error = error;
  return o;
}

}  // namespace

struct Server::Impl {
  Impl(Engine& e, std::shared_ptr<const io::Tokenizer> t, std::shared_ptr<const io::ChatTemplate> c,
       ServerOptions o)
      : engine(e), tok(std::move(t)), tpl(std::move(c)), opts(std::move(o)) {
    limits.served_model_name = opts.served_model_name;
    limits.tokenizer = tok.get();
    limits.chat_template = tpl.get();
    limits.max_model_len = engine.max_model_len();
    limits.vocab_size = opts.vocab_size;
  }

  Engine& engine;
  std::shared_ptr<const io::Tokenizer> tok;
  std::shared_ptr<const io::ChatTemplate> tpl;
  ServerOptions opts;
  RequestLimits limits;
  Metrics metrics;
  HttpServer http;
  std::stop_source engine_stop;
  std::thread engine_thread, http_thread;
  int port = -1;
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  std::atomic<int64_t> counter{0};

  std::mutex mu;  // the fields below
  std::condition_variable cv;
  std::map<int64_t, std::shared_ptr<Pending>> active;
  bool draining = false, stopped = false, started = false, engine_dead = false;
  bool loop_running = false;  // run_engine is inside Engine::run
  std::string engine_error;

  std::mutex modeled_mu;
  std::map<std::pair<int64_t, int64_t>, json> modeled_cache;

  // The request's registration: cancels it in the engine if it has not finished when the HTTP
  // side lets go of it (a client gone, a write failed), and unregisters it.
  struct Ticket {
    Impl* s;
    int64_t id;
    std::shared_ptr<Pending> p;
    Ticket(Impl* s_, int64_t id_, std::shared_ptr<Pending> p_) : s(s_), id(id_), p(std::move(p_)) {}
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() {
      if (!p->done()) s->engine.cancel(id);
      std::lock_guard<std::mutex> g(s->mu);
      s->active.erase(id);
      s->cv.notify_all();
    }
  };

  void run_engine() {
    {
      std::lock_guard<std::mutex> g(mu);
      if (stopped || engine_stop.stop_requested()) return;
      loop_running = true;
    }
    try {
      engine.run(engine_stop.get_token());
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> g(mu);
      engine_dead = true;
      engine_error = io::one_line(e.what());
      for (auto& [id, p] : active) p->push(final_output(FinishReason::error, engine_error));
      std::fprintf(stderr, "nxd-serve: the engine failed: %s\n", engine_error.c_str());
    }
    std::lock_guard<std::mutex> g(mu);
    loop_running = false;
    cv.notify_all();
  }

  void on_output(Pending& p, const Output& o) {  // the engine thread
    const auto now = Clock::now();
    const auto n = static_cast<int64_t>(o.ids.size());
    if (n > 0) {
      if (p.first) {
        metrics.time_to_first_token(Seconds(now - p.submitted).count());
        if (n > 1) metrics.inter_token(0, n - 1);
        p.first = false;
      } else {
        metrics.inter_token(Seconds(now - p.last_token).count() / double(n), n);
      }
      p.last_token = now;
      metrics.generated(n, now);
    }
    if (o.finish != FinishReason::none) metrics.finished(to_string(o.finish));
    p.push(o);
  }

  std::unique_ptr<Ticket> submit(ParsedRequest& req) {
    auto p = std::make_shared<Pending>();
    {
      std::lock_guard<std::mutex> g(mu);
      if (draining) throw ApiError(503, "", "the server is shutting down", "server_error");
      if (engine_dead)
        throw ApiError(500, "", "the engine failed: " + engine_error, "server_error");
    }
    int64_t id = 0;
    try {
      id = engine.submit(req.request, [this, p](const Output& o) { on_output(*p, o); });
    } catch (const QueueFull& e) {
      throw ApiError(429, "", str("the server is busy: ", e.what()), "rate_limit_exceeded",
                     "rate_limit_exceeded");
    } catch (const InvalidArgument& e) {
      throw ApiError(400, "", io::one_line(e.what()));
    }
    std::lock_guard<std::mutex> g(mu);
    active[id] = p;
    if (engine_dead) p->push(final_output(FinishReason::error, engine_error));
    return std::unique_ptr<Ticket>(new Ticket{this, id, p});
  }

  json usage(const Output& last) {
    json u = usage_json(last);
    if (!opts.modeled) return u;
    const auto key =
        std::make_pair(last.prompt_tokens, std::max<int64_t>(1, last.completion_tokens));
    {
      std::lock_guard<std::mutex> g(modeled_mu);
      if (auto it = modeled_cache.find(key); it != modeled_cache.end()) {
        u["modeled"] = it->second;
        return u;
      }
    }
    InferenceModelOptions io;
    io.tp = opts.modeled->tp;
    io.instance = opts.modeled->instance;
    io.prompt_tokens = key.first;
    io.new_tokens = key.second;
    const InferenceEstimate e = estimate_inference(opts.modeled->model, io);
    json m = {{"instance", e.machine},
              {"tp", io.tp},
              {"ttft_ms", e.ttft * 1e3},
              {"tpot_ms", e.tpot * 1e3},
              {"e2e_ms", (e.ttft + double(key.second - 1) * e.tpot) * 1e3}};
    std::lock_guard<std::mutex> g(modeled_mu);
    if (modeled_cache.size() > 4096) modeled_cache.clear();
    modeled_cache[key] = m;
    u["modeled"] = m;
    return u;
  }

  void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(dump(error_body(e)), "application/json");
  }

  ResponseBuilder builder(const ParsedRequest& req) {
    const bool chat = req.endpoint == Endpoint::chat;
    return ResponseBuilder(
        req.endpoint, str(chat ? "chatcmpl-" : "cmpl-", created, "-", counter.fetch_add(1)),
        opts.served_model_name, static_cast<int64_t>(std::time(nullptr)), tok.get(), req.logprobs);
  }

  void completion(const httplib::Request& hreq, httplib::Response& res, Endpoint endpoint) {
    ParsedRequest req = parse_request(endpoint, hreq.body, limits);
    auto ticket = submit(req);
    if (req.stream)
      stream(res, req, std::move(ticket));
    else
      whole(res, req, std::move(ticket));
  }

  void stream(httplib::Response& res, const ParsedRequest& req, std::unique_ptr<Ticket> ticket) {
    struct State {
      std::unique_ptr<Ticket> ticket;
      ResponseBuilder rb;
      bool chat, include_usage, sent_role = false;
    };
    auto st = std::make_shared<State>(
        State{std::move(ticket), builder(req), req.endpoint == Endpoint::chat, req.include_usage});
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [this, st](size_t,
                                                                     httplib::DataSink& sink) {
      auto event = [&](const json& j) {
        const std::string s = "data: " + dump(j) + "\n\n";
        return sink.write(s.data(), s.size());
      };
      if (st->chat && !st->sent_role) {
        st->sent_role = true;
        if (!event(st->rb.role_chunk())) return false;
      }
      const std::vector<Output> outs = st->ticket->p->take(Seconds(opts.liveness_interval_s));
      if (outs.empty()) {  // a comment line: clients ignore it; a gone client fails it
        static const std::string ping = ": keep-alive\n\n";
        return sink.write(ping.data(), ping.size());
      }
      for (const Output& o : outs) {
        st->rb.add(o);
        const json c = st->rb.chunk(o);
        if (!c.is_null() && !event(c)) return false;
        if (o.finish == FinishReason::none) continue;
        if (o.finish == FinishReason::error &&
            !event(error_body(ApiError(500, "", "generation failed: " + o.error, "server_error"))))
          return false;
        if (st->include_usage && !event(st->rb.usage_chunk(usage(o)))) return false;
        static const std::string done = "data: [DONE]\n\n";
        if (!sink.write(done.data(), done.size())) return false;
        sink.done();
        return true;
      }
      return true;
    });
  }

  void whole(httplib::Response& res, const ParsedRequest& req, std::unique_ptr<Ticket> ticket) {
    auto rb = std::make_shared<ResponseBuilder>(builder(req));
    // Short answers come back whole; a longer wait turns into a chunked body whose leading
    // spaces (valid JSON whitespace) probe the client every liveness interval.
    const auto until = Clock::now() + Seconds(opts.liveness_interval_s);
    while (Clock::now() < until && rb->last().finish == FinishReason::none)
      for (const Output& o : ticket->p->take(until - Clock::now())) rb->add(o);
    if (rb->last().finish != FinishReason::none) {
      answer(res, *rb);
      return;
    }
    std::shared_ptr<Ticket> t(std::move(ticket));
    res.set_chunked_content_provider(
        "application/json", [this, t, rb](size_t, httplib::DataSink& sink) {
          for (const Output& o : t->p->take(Seconds(opts.liveness_interval_s))) rb->add(o);
          if (rb->last().finish == FinishReason::none) return sink.write(" ", 1);
          const std::string body =
              rb->last().finish == FinishReason::error
                  ? dump(error_body(ApiError(500, "", rb->last().error, "server_error")))
                  : dump(rb->whole(usage(rb->last())));
          if (!sink.write(body.data(), body.size())) return false;
          sink.done();
          return true;
        });
  }

  void answer(httplib::Response& res, const ResponseBuilder& rb) {
    if (rb.last().finish == FinishReason::error)
      return send_error(res,
                        ApiError(500, "", "generation failed: " + rb.last().error, "server_error"));
    res.set_content(dump(rb.whole(usage(rb.last()))), "application/json");
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (opts.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return true;
    if (req.get_header_value("Authorization") == "Bearer " + opts.api_key) return true;
    send_error(res, ApiError(401, "", "Incorrect API key provided (Authorization: Bearer <key>)",
                             "invalid_request_error", "invalid_api_key"));
    return false;
  }

  void routes();
  void error_handlers();
};

void Server::Impl::routes() {
  auto guarded = [this](auto fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const std::exception& e) {
        send_error(res, ApiError(500, "", io::one_line(e.what()), "server_error"));
      }
    };
  };
  http.Post("/v1/completions", guarded([this](const httplib::Request& q, httplib::Response& r) {
              completion(q, r, Endpoint::completions);
            }));
  http.Post("/v1/chat/completions",
            guarded([this](const httplib::Request& q, httplib::Response& r) {
              completion(q, r, Endpoint::chat);
            }));
  http.Get(
      "/v1/models", guarded([this](const httplib::Request&, httplib::Response& r) {
        const json m = {{"id", opts.served_model_name},
                        {"object", "model"},
                        {"created", created},
                        {"owned_by", "nxd"},
                        {"max_model_len", limits.max_model_len}};
        r.set_content(dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
      }));
  http.Get("/health", guarded([this](const httplib::Request&, httplib::Response& r) {
             std::lock_guard<std::mutex> g(mu);
             if (draining || engine_dead)
               return send_error(r,
                                 ApiError(503, "", draining ? "shutting down" : "the engine failed",
                                          "server_error"));
             r.set_content(dump({{"status", "ok"}}), "application/json");
           }));
  http.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& r) {
             r.set_content(metrics.text(engine.stats()), "text/plain; version=0.0.4");
           }));
  error_handlers();
}

// Authentication before routing, and httplib's own refusals (404 no route, 413 body too large,
// 400 unreadable request) in OpenAI's shape, every error counted.
void Server::Impl::error_handlers() {
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return authorized(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                : httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        metrics.http_error(res.status);
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        const std::string msg =
            res.status == 413   ? str("the request body is over ", opts.max_body_bytes, " bytes")
            : res.status == 404 ? str("no route ", req.method, " ", io::shorten(req.path))
                                : str("HTTP ", res.status);
        send_error(res, ApiError(res.status, res.status == 413 ? "body" : "", msg));
        return httplib::Server::HandlerResponse::Handled;
      }));
  http.set_exception_handler(
      [this](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        send_error(res, ApiError(500, "", "internal error", "server_error"));
      });
}

Server::Server(Engine& engine, std::shared_ptr<const io::Tokenizer> tokenizer,
               std::shared_ptr<const io::ChatTemplate> chat_template, ServerOptions opts)
    : impl_(std::make_unique<Impl>(engine, std::move(tokenizer), std::move(chat_template),
                                   std::move(opts))) {
  Impl& I = *impl_;
  NXD_CHECK(I.opts.http_threads >= 1, "[nxd-serve] http_threads must be >= 1, got ",
            I.opts.http_threads);
  NXD_CHECK(I.opts.max_body_bytes >= 1, "[nxd-serve] max_body_bytes must be >= 1, got ",
            I.opts.max_body_bytes);
  NXD_CHECK(I.opts.liveness_interval_s > 0, "[nxd-serve] liveness_interval_s must be > 0");
  NXD_CHECK(!I.opts.served_model_name.empty(), "[nxd-serve] served_model_name is empty");
  NXD_CHECK(I.opts.vocab_size >= 1, "[nxd-serve] vocab_size must be the model's, got ",
            I.opts.vocab_size);
  const int threads = I.opts.http_threads;
  I.http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  I.http.set_payload_max_length(static_cast<size_t>(I.opts.max_body_bytes));
  I.http.set_read_timeout(10);
  I.http.set_write_timeout(10);
  I.http.set_keep_alive_timeout(2);
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which lets a second server
  // share a port that is in use instead of failing
  I.http.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  I.routes();
}

Server::~Server() {
  stop();
}

void Server::start() {
  Impl& I = *impl_;
  {
    std::lock_guard<std::mutex> g(I.mu);
    NXD_CHECK(!I.started, "[nxd-serve] start() called twice");
    I.started = true;
  }
  const bool bound = I.opts.port == 0 ? (I.port = I.http.bind_to_any_port(I.opts.host)) > 0
                                      : I.http.bind_to_port(I.opts.host, I.opts.port);
  if (!bound)
    throw IoError(str("[nxd-serve] cannot listen on ", I.opts.host, ":", I.opts.port,
                      " (in use, or not an address of this machine)"));
  if (I.opts.port != 0) I.port = I.opts.port;
  I.http.widen_backlog();
  if (I.opts.engine_loop == EngineLoop::own_thread)
    I.engine_thread = std::thread([&I] { I.run_engine(); });
  I.http_thread = std::thread([&I] { I.http.listen_after_bind(); });
}

int Server::port() const {
  return impl_->port;
}

void Server::stop() {
  Impl& I = *impl_;
  std::unique_lock<std::mutex> l(I.mu);
  if (I.stopped || !I.started) {
    I.stopped = true;
    I.cv.notify_all();
    return;
  }
  if (I.draining) {  // another thread is stopping it: wait for that
    I.cv.wait(l, [&] { return I.stopped; });
    return;
  }
  I.draining = true;
  I.cv.wait_for(l, Seconds(I.opts.shutdown_grace_s), [&] { return I.active.empty(); });
  for (auto& [id, p] : I.active) I.engine.cancel(id);
  I.cv.wait_for(l, Seconds(2), [&] { return I.active.empty(); });
  for (auto& [id, p] : I.active)  // an engine that does not answer: end them here
    p->push(final_output(FinishReason::cancelled));
  l.unlock();
  I.http.stop();
  if (I.http_thread.joinable()) I.http_thread.join();
  I.engine_stop.request_stop();
  if (I.engine_thread.joinable()) I.engine_thread.join();
  l.lock();
  I.cv.wait(l, [&] { return !I.loop_running; });  // EngineLoop::caller: its loop has ended
  I.stopped = true;
  I.cv.notify_all();
}

void Server::run_engine() {
  NXD_CHECK(impl_->opts.engine_loop == EngineLoop::caller,
            "[nxd-serve] run_engine() needs EngineLoop::caller (the server runs its own loop)");
  impl_->run_engine();
}

void Server::wait() {
  std::unique_lock<std::mutex> l(impl_->mu);
  impl_->cv.wait(l, [&] { return impl_->stopped; });
}

}  // namespace nxd::inference::server

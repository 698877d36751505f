// nxd-serve: an OpenAI-compatible HTTP server (inference/server/server.h) over the inference
// engine (inference/engine.h: continuous batching, paged KV cache, prefix caching, chunked
// prefill) for a trained (nxd checkpoint) or imported (transformers folder) causal LM.
//   nxd-serve (--checkpoint DIR | --hf DIR) [--tokenizer PATH|bytes] [--chat-template FILE]
//             [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--served-model-name NAME]
//             [--max-num-seqs N] [--max-num-batched-tokens N] [--kv-blocks N | --kv-memory SIZE]
//             [--max-waiting N] [--tp N] [--instance TYPE] [--quantize
//             int8|int4[:G][:asym][:q8][:head]]
//             [--chunked-prefill on|off] [--prefix-caching on|off]
//             [--long-prefill-token-threshold N] [--prefill-calls per_request|batched]
//             [--draft-model DIR [--speculate K]]
// --draft-model DIR decodes speculatively in the engine (docs/design/inference.md): a draft (an
// nxd checkpoint, a transformers folder or a GGUF file, as --checkpoint/--hf) with the model's
// vocab_size proposes K tokens (default 4) per request and step; it is built at TP 1 and, with
// --tp N > 1, runs on rank 0 alone while the model verifies over the N ranks.
// --checkpoint takes a quantized checkpoint too (nxd-ckpt quantize; checkpoint/quantized.h);
// --quantize quantizes the decoder's linear layers at load (layers/models/quantize_lm.h).
// Without a tokenizer.json (--tokenizer, or --hf's) the ids are UTF-8 bytes (a model nxd-train
// trained without data.tokenizer; vocab_size >= 256), as nxd-generate's default.
// The chat template is --chat-template's file, else chat_template.jinja or tokenizer_config.json
// in --hf's folder or the tokenizer's folder (io/chat_template.h; without one, chat answers 400).
// EOS ids: generation_config.json / config.json of that folder, plus tokenizer_config.json's
// eos_token when it is one token. --tp N > 1 runs the model's shards on N sim ranks (threads of
// this process): every rank builds its Engine, rank 0's serves HTTP and the others follow its
// steps (inference/engine.h). SIGTERM or SIGINT stops it gracefully (new requests 503,
// in-flight ones get 10 s, then are cancelled). Exit codes: 0 stopped by a signal, 2 a user
// mistake (flag, path, port in use), 1 anything else.
#include <pthread.h>
#include <signal.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/model_source.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/inference/engine.h"
#include "nxd/inference/server/server.h"
#include "nxd/io/bounded_read.h"
#include "nxd/io/chat_template.h"
#include "nxd/io/env_check.h"
#include "nxd/io/tokenizer.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/models/inference_model.h"
#include "nxd/layers/models/quantize_lm.h"

namespace fs = std::filesystem;
using namespace nxd;

namespace {

const char* kUsage =
    "usage: nxd-serve (--checkpoint DIR | --hf DIR) [--tokenizer PATH|bytes] [--chat-template F]\n"
    "                 [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--served-model-name N]\n"
    "                 [--max-num-seqs N] [--max-num-batched-tokens N]\n"
    "                 [--kv-blocks N | --kv-memory SIZE] [--max-waiting N] [--tp N]\n"
    "                 [--instance TYPE] [--quantize int8|int4[:G][:asym][:q8][:head]]\n"
    "                 [--chunked-prefill on|off] [--prefix-caching on|off]\n"
    "                 [--long-prefill-token-threshold N] [--prefill-calls per_request|batched]\n"
    "                 [--draft-model DIR [--speculate K]]\n"
    "  --checkpoint DIR   an nxd checkpoint (DIR/<tag> or a folder of them: the newest complete),\n"
    "                     or a quantized one (nxd-ckpt quantize)\n"
    "  --hf DIR           a transformers Llama / GPT-NeoX folder (config.json, safetensors)\n"
    "  --tokenizer PATH   a transformers tokenizer.json (default: --hf DIR's if any, else\n"
    "                     bytes: UTF-8 bytes are the ids, as nxd-train without data.tokenizer;\n"
    "                     'bytes' chooses that)\n"
    "  --chat-template F  a Jinja chat template file (default: the model folder's)\n"
    "  --port 0           any free port (printed)\n"
    "  --api-key KEY      clients must send 'Authorization: Bearer KEY' (401 otherwise)\n"
    "  --max-num-seqs N   requests in the running batch (default 16)\n"
    "  --max-num-batched-tokens N  tokens of one engine step (default 512)\n"
    "  --kv-blocks N      KV cache blocks of 16 positions; --kv-memory SIZE (512M, 2G) instead\n"
    "  --max-waiting N    queued requests beyond which the server answers 429 (default 256)\n"
    "  --chunked-prefill on|off  split long prompts over engine steps (default on)\n"
    "  --long-prefill-token-threshold N  at most N prompt tokens of one request per step\n"
    "                     (with chunked prefill; default 0: no limit)\n"
    "  --prefill-calls per_request|batched  each request's prefill chunk in a model call of its\n"
    "                     own, bitwise what it gets alone (default), or chunks of similar length\n"
    "                     in one padded call\n"
    "  --prefix-caching on|off   reuse the K/V of shared prompt prefixes (default on)\n"
    "  --tp N             tensor parallel over N sim ranks (threads) of the model's shards\n"
    "  --instance TYPE    each response's usage.modeled carries the modeled time to first token\n"
    "                     and time per output token on this Neuron instance (inf2.xlarge, ...)\n"
    "  --quantize F       quantize the decoder's linear layers at load: int8, or int4 in groups\n"
    "                     of 32 (int4:64, int4:128; :asym with a per-group minimum); :head\n"
    "                     (last) quantizes the output head too, in int8 (:head=int4: int4)\n"
    "  --draft-model DIR  speculative decoding: a smaller model with the same vocab_size (an nxd\n"
    "                     checkpoint, a transformers folder or a GGUF file) proposes tokens the\n"
    "                     model verifies in one step (greedy output unchanged; the draft runs\n"
    "                     at TP 1, on rank 0 with --tp N)\n"
    "  --speculate K      tokens the draft proposes per request and step, 1..64 (default 4)\n";

struct Usage : UserError {
  using UserError::UserError;
};

struct ServeCli {
  std::string checkpoint, hf, tokenizer, chat_template, instance, draft_model;
  int64_t speculate = 0;  // 0: 4 with a draft
  inference::EngineOptions engine;
  inference::server::ServerOptions server;
  int tp = 1;
  QuantizeOptions quant{.format = WeightQuant::none};  // --quantize: at load
};

int64_t to_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  try {
    return io::parse_int(v, lo, hi, flag, "nxd-serve");
  } catch (const ConfigError& e) {
    throw Usage(e.what());
  }
}

bool on_off(const std::string& flag, const std::string& v) {
  if (v != "on" && v != "off") throw Usage(str(flag, " ", v, ": expected on or off"));
  return v == "on";
}

int64_t to_bytes(const std::string& flag, const std::string& v) {
  int64_t mult = 1;
  std::string digits = v;
  if (!v.empty()) {
    const char s = static_cast<char>(std::toupper(static_cast<unsigned char>(v.back())));
    mult = s == 'K' ? 1 << 10 : s == 'M' ? 1 << 20 : s == 'G' ? int64_t{1} << 30 : 1;
    if (mult > 1) digits.pop_back();
  }
  return to_int(flag, digits, 1, (int64_t{1} << 50) / mult) * mult;
}

ServeCli parse_args(int argc, char** argv) {
  ServeCli c;
  c.server.port = 8000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") throw Usage("");
    if (a.rfind("--", 0) != 0) throw Usage(str("unexpected argument '", a, "'"));
    if (i + 1 >= argc) throw Usage(str(a, " needs a value"));
    const std::string v = argv[++i];
    if (a == "--checkpoint")
      c.checkpoint = v;
    else if (a == "--hf")
      c.hf = v;
    else if (a == "--tokenizer")
      c.tokenizer = v;
    else if (a == "--chat-template")
      c.chat_template = v;
    else if (a == "--host")
      c.server.host = v;
    else if (a == "--port")
      c.server.port = static_cast<int>(to_int(a, v, 0, 65535));
    else if (a == "--api-key")
      c.server.api_key = v;
    else if (a == "--served-model-name")
      c.server.served_model_name = v;
    else if (a == "--max-num-seqs")
      c.engine.max_num_seqs = to_int(a, v, 1, 1 << 16);
    else if (a == "--max-num-batched-tokens")
      c.engine.max_num_batched_tokens = to_int(a, v, 1, 1 << 24);
    else if (a == "--kv-blocks")
      c.engine.kv_blocks = to_int(a, v, 1, int64_t{1} << 32);
    else if (a == "--kv-memory")
      c.engine.kv_memory_bytes = to_bytes(a, v);
    else if (a == "--max-waiting")
      c.engine.max_waiting = to_int(a, v, 1, 1 << 20);
    else if (a == "--tp")
      c.tp = static_cast<int>(to_int(a, v, 1, 64));
    else if (a == "--draft-model")
      c.draft_model = v;
    else if (a == "--speculate")
      c.speculate = to_int(a, v, 1, 64);
    else if (a == "--instance")
      c.instance = v;
    else if (a == "--quantize")
      try {
        c.quant = parse_weight_quant(v);
      } catch (const ConfigError& e) {
        throw Usage(str("--quantize: ", e.what()));
      }
    else if (a == "--long-prefill-token-threshold")
      c.engine.long_prefill_token_threshold = to_int(a, v, 0, 1 << 24);
    else if (a == "--chunked-prefill")
      c.engine.chunked_prefill = on_off(a, v);
    else if (a == "--prefill-calls" && (v == "per_request" || v == "batched"))
      c.engine.prefill_calls =
          v == "batched" ? inference::PrefillCalls::batched : inference::PrefillCalls::per_request;
    else if (a == "--prefill-calls")
      throw Usage(str("--prefill-calls ", v, ": expected per_request or batched"));
    else if (a == "--prefix-caching")
      c.engine.prefix_caching = on_off(a, v);
    else
      throw Usage(str("unknown flag '", a, "'"));
  }
  if (c.checkpoint.empty() == c.hf.empty()) throw Usage("give one of --checkpoint DIR or --hf DIR");
  if (c.speculate > 0 && c.draft_model.empty())
    throw Usage("--speculate K needs --draft-model DIR");
  c.engine.speculate_k = c.speculate > 0 ? c.speculate : 4;
  if (c.engine.kv_blocks > 0 && c.engine.kv_memory_bytes > 0)
    throw Usage("give one of --kv-blocks or --kv-memory, not both");
  if (c.server.served_model_name.empty())
    c.server.served_model_name = fs::path(c.hf.empty() ? c.checkpoint : c.hf).filename().string();
  if (c.server.served_model_name.empty()) c.server.served_model_name = "nxd";
  return c;
}

// Where the weights come from, read once before any rank starts (checkpoint/model_source.h,
// as nxd-generate): a LoRA checkpoint is refused (merge it first).
ckpt::ModelSource resolve_weights(const ServeCli& c) {
  if (c.quant.format != WeightQuant::none && !c.checkpoint.empty() &&
      ckpt::is_quantized_checkpoint(c.checkpoint))
    throw Usage(str("--quantize ", describe(c.quant), " on --checkpoint ", c.checkpoint,
                    ", which is quantized already (",
                    describe(ckpt::read_quantized_checkpoint(c.checkpoint).opts),
                    "): drop --quantize, or quantize the unquantized checkpoint"));
  return ckpt::resolve_model_source({.tool = "nxd-serve",
                                     .checkpoint = c.checkpoint,
                                     .hf = c.hf,
                                     .tp = c.tp,
                                     .lora_checkpoints = ckpt::LoraCheckpoints::refuse});
}

// The draft's source (--draft-model): a GGUF file, a transformers folder (config.json) or an nxd
// checkpoint, as nxd-generate's; its vocab_size must be the model's.
ckpt::ModelSource resolve_draft(const ServeCli& c, const ModelConfig& target) {
  ckpt::ModelSourceOptions o{.tool = "nxd-serve",
                             .lora_checkpoints = ckpt::LoraCheckpoints::refuse};
  ckpt::set_source_path(o, c.draft_model);
  ckpt::ModelSource s = ckpt::resolve_model_source(o);
  if (s.cfg.vocab_size != target.vocab_size)
    throw Usage(str("--draft-model ", c.draft_model, " has vocab_size ", s.cfg.vocab_size,
                    ", the model has ", target.vocab_size, " (a draft must share its vocabulary)"));
  return s;
}

// This rank's model with its weights (parallel_state already set up at TP > 1), quantized at
// load with --quantize (every rank: a row-parallel int8 layer's scales are collective).
std::shared_ptr<CausalLM> build_model(const ServeCli& c, const ckpt::ModelSource& w) {
  auto m = ckpt::build_model(w);
  if (c.quant.format != WeightQuant::none) quantize_causal_lm(*m, {}, c.quant);
  return m;
}

// The folder with tokenizer_config.json / generation_config.json: --hf's, else the tokenizer's.
std::string model_folder(const ServeCli& c, const std::string& tokenizer_path) {
  if (!c.hf.empty()) return c.hf;
  if (!tokenizer_path.empty()) return fs::path(tokenizer_path).parent_path().string();
  return "";
}

std::vector<int64_t> eos_ids(const std::string& folder, const io::Tokenizer* tok,
                             const io::ChatTemplate* tpl) {
  std::vector<int64_t> ids;
  if (!folder.empty() && (fs::is_regular_file(fs::path(folder) / "config.json") ||
                          fs::is_regular_file(fs::path(folder) / "generation_config.json")))
    ids = inference::read_eos_ids(folder);
  if (tok && tpl && !tpl->eos_token().empty()) {
    const std::vector<int64_t> e = tok->encode(tpl->eos_token());
    if (e.size() == 1 && std::find(ids.begin(), ids.end(), e[0]) == ids.end()) ids.push_back(e[0]);
  }
  return ids;
}

void announce(const ServeCli& c, const inference::server::Server& server,
              const inference::Engine& engine, const io::ChatTemplate* tpl) {
  const auto st = engine.stats();
  std::printf(
      "nxd-serve: serving '%s' on http://%s:%d (TP %d, max_model_len %lld, %lld KV blocks of "
      "%lld, chat template: %s, EOS ids: %zu)\n",
      c.server.served_model_name.c_str(), c.server.host.c_str(), server.port(), c.tp,
      (long long)engine.max_model_len(), (long long)st.kv_blocks_total,
      (long long)c.engine.block_size, tpl ? tpl->origin().c_str() : "none",
      c.engine.eos_token_ids.size());
  std::fflush(stdout);
}

void wait_for_signal(const sigset_t& sigs, const ServeCli& c) {
  int sig = 0;
  sigwait(&sigs, &sig);
  std::printf("nxd-serve: %s: stopping (new requests 503, in-flight ones get %.0f s)\n",
              sig == SIGTERM ? "SIGTERM" : "SIGINT", c.server.shutdown_grace_s);
  std::fflush(stdout);
}

// TP > 1: the model's shards on sim ranks (threads); every rank builds its Engine, rank 0's
// serves HTTP and runs the loop the others follow. This thread waits for the signal.
void serve_tensor_parallel(ServeCli& c, const ckpt::ModelSource& w,
                           const std::shared_ptr<const io::Tokenizer>& tok,
                           const std::shared_ptr<const io::ChatTemplate>& tpl,
                           const sigset_t& sigs) {
  std::mutex mu;
  std::condition_variable cv;
  inference::server::Server* server = nullptr;
  bool failed = false, released = false;
  c.server.engine_loop = inference::server::EngineLoop::caller;
  sim::LaunchOptions lo;
  lo.world_size = c.tp;
  lo.instance = c.instance.empty() ? (c.tp <= 2    ? "inf2.xlarge"
                                      : c.tp <= 12 ? "inf2.24xlarge"
                                      : c.tp <= 24 ? "inf2.48xlarge"
                                                   : "trn1.32xlarge")
                                   : c.instance;
  lo.memory_capacity = 0;  // the host's memory, not the modeled core's
  std::exception_ptr error;
  std::thread ranks([&] {
    try {
      sim::launch(lo, [&] {
        parallel_state::initialize_model_parallel(c.tp);
        inference::Engine engine(build_model(c, w), tok, c.engine);
        if (parallel_state::get_tensor_model_parallel_rank() != 0) {
          engine.run(std::stop_token{});  // follows rank 0's loop until it ends
          return;
        }
        inference::server::Server s(engine, tok, tpl, c.server);
        s.start();
        announce(c, s, engine, tpl.get());
        {
          std::lock_guard<std::mutex> g(mu);
          server = &s;
          cv.notify_all();
        }
        s.run_engine();  // until stop()
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return released; });  // main's stop() has returned
      });
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> g(mu);
    failed = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return server != nullptr || failed; });
  }
  if (server) {
    wait_for_signal(sigs, c);
    server->stop();
    std::lock_guard<std::mutex> g(mu);
    released = true;
    cv.notify_all();
  }
  ranks.join();
  if (error) std::rethrow_exception(error);
}

int run(int argc, char** argv) {
  ServeCli c = parse_args(argc, argv);
  io::check_environment();
  std::string tok_path = c.tokenizer;
  if (tok_path.empty() && !c.hf.empty() && fs::is_regular_file(fs::path(c.hf) / "tokenizer.json"))
    tok_path = (fs::path(c.hf) / "tokenizer.json").string();
  if (!c.hf.empty() && !fs::is_directory(c.hf)) throw Usage(str("--hf ", c.hf, ": no such folder"));
  // no tokenizer.json (nxd-train's data without data.tokenizer): UTF-8 bytes are the ids, as
  // nxd-generate's default
  if (tok_path == "bytes") tok_path.clear();
  auto tok = std::make_shared<const io::Tokenizer>(
      tok_path.empty() ? io::Tokenizer::bytes() : io::Tokenizer::from_file(tok_path));
  std::printf("nxd-serve: tokenizer: %s\n", tok->description().c_str());
  const std::string folder = model_folder(c, tok_path);
  std::shared_ptr<const io::ChatTemplate> tpl;
  if (!c.chat_template.empty()) {
    const std::string src =
        io::read_regular_file(c.chat_template, "--chat-template", 16 << 20, "nxd-serve");
    std::string bos, eos;
    if (!folder.empty() && io::ChatTemplate::folder_has_template(folder)) {
      const auto from = io::ChatTemplate::from_folder(folder);
      bos = from.bos_token(), eos = from.eos_token();
    }
    tpl = std::make_shared<const io::ChatTemplate>(
        io::ChatTemplate::parse(src, c.chat_template, bos, eos));
  } else if (!folder.empty() && io::ChatTemplate::folder_has_template(folder)) {
    tpl = std::make_shared<const io::ChatTemplate>(io::ChatTemplate::from_folder(folder));
  }
  const ckpt::ModelSource w = resolve_weights(c);
  const ModelConfig& cfg = w.cfg;
  if (tok->is_bytes() && cfg.vocab_size < 256)
    throw Usage(str("byte-level tokens need vocab_size >= 256, the model has ", cfg.vocab_size,
                    ": give --tokenizer PATH (a transformers tokenizer.json)"));
  if (tok->vocab_size() > cfg.vocab_size)
    throw ConfigError(str("[nxd-serve] the tokenizer ", tok_path, " has ", tok->vocab_size(),
                          " ids but the model's vocab_size is ", cfg.vocab_size));
  c.engine.eos_token_ids = eos_ids(folder, tok.get(), tpl.get());
  c.server.vocab_size = cfg.vocab_size;
  if (!c.instance.empty()) {
    InferenceModelOptions probe;  // an unknown instance is a user mistake found now
    probe.instance = c.instance;
    probe.tp = c.tp;
    probe.prompt_tokens = probe.new_tokens = 1;
    try {
      estimate_inference(cfg, probe);
    } catch (const ConfigError& e) {
      throw Usage(str("--instance: ", e.what()));
    }
    c.server.modeled = inference::server::ModeledLatency{cfg, c.instance, c.tp};
  }
  // signals go to the thread that waits for them, not to the server's threads
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  if (!c.draft_model.empty()) {
    c.engine.draft_model = ckpt::build_model(resolve_draft(c, cfg));
    std::printf("nxd-serve: speculative decoding: draft %s, %lld tokens per step\n",
                c.draft_model.c_str(), (long long)c.engine.speculate_k);
  }
  if (c.tp == 1) {
    inference::Engine engine(build_model(c, w), tok, c.engine);
    inference::server::Server server(engine, tok, tpl, c.server);
    server.start();
    announce(c, server, engine, tpl.get());
    wait_for_signal(sigs, c);
    server.stop();
  } else {
    serve_tensor_parallel(c, w, tok, tpl, sigs);
  }
  std::printf("nxd-serve: stopped\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Usage& e) {
    std::fprintf(stderr, "%s%s%s", *e.what() ? "nxd-serve: error: " : "", e.what(),
                 *e.what() ? "\n" : "");
    std::fputs(kUsage, stderr);
    return *e.what() ? 2 : 0;
  } catch (const UserError& e) {
    std::fprintf(stderr, "nxd-serve: error: %s\n", io::one_line(e.what()).c_str());
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    std::fprintf(stderr, "nxd-serve: error: %s\n", io::one_line(e.what()).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nxd-serve: internal error: %s\n", io::one_line(e.what()).c_str());
    return 1;
  }
}

// nxd-serve: an OpenAI-compatible HTTP server (inference/server/server.h) over the inference
// engine (inference/engine.h: continuous batching, paged KV cache, prefix caching, chunked
// prefill) for a trained (nxd checkpoint) or imported (transformers folder) causal LM.
//   nxd-serve (--checkpoint DIR | --hf DIR) [--tokenizer PATH] [--chat-template FILE]
//             [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--served-model-name NAME]
//             [--max-num-seqs N] [--max-num-batched-tokens N] [--kv-blocks N | --kv-memory SIZE]
//             [--max-waiting N] [--tp 1] [--instance TYPE]
// The chat template is --chat-template's file, else chat_template.jinja or tokenizer_config.json
// in --hf's folder or the tokenizer's folder (io/chat_template.h; without one, chat answers 400).
// EOS ids: generation_config.json / config.json of that folder, plus tokenizer_config.json's
// eos_token when it is one token. SIGTERM or SIGINT stops it gracefully (new requests 503,
// in-flight ones get 10 s, then are cancelled). Exit codes: 0 stopped by a signal, 2 a user
// mistake (flag, path, port in use), 1 anything else.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/inference/engine.h"
#include "nxd/inference/server/server.h"
#include "nxd/io/bounded_read.h"
#include "nxd/io/chat_template.h"
#include "nxd/io/env_check.h"
#include "nxd/io/tokenizer.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/models/inference_model.h"

namespace fs = std::filesystem;
using namespace nxd;

namespace {

const char* kUsage =
    "usage: nxd-serve (--checkpoint DIR | --hf DIR) [--tokenizer PATH] [--chat-template FILE]\n"
    "                 [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--served-model-name N]\n"
    "                 [--max-num-seqs N] [--max-num-batched-tokens N]\n"
    "                 [--kv-blocks N | --kv-memory SIZE] [--max-waiting N] [--tp 1]\n"
    "                 [--instance TYPE]\n"
    "  --checkpoint DIR   an nxd checkpoint (DIR/<tag> or a folder of them: the newest complete)\n"
    "  --hf DIR           a transformers Llama / GPT-NeoX folder (config.json, safetensors)\n"
    "  --tokenizer PATH   a transformers tokenizer.json (default: --hf DIR's)\n"
    "  --chat-template F  a Jinja chat template file (default: the model folder's)\n"
    "  --port 0           any free port (printed)\n"
    "  --api-key KEY      clients must send 'Authorization: Bearer KEY' (401 otherwise)\n"
    "  --max-num-seqs N   requests in the running batch (default 16)\n"
    "  --max-num-batched-tokens N  tokens of one engine step (default 512)\n"
    "  --kv-blocks N      KV cache blocks of 16 positions; --kv-memory SIZE (512M, 2G) instead\n"
    "  --max-waiting N    queued requests beyond which the server answers 429 (default 256)\n"
    "  --tp 1             the engine serves at TP 1\n"
    "  --instance TYPE    each response's usage.modeled carries the modeled time to first token\n"
    "                     and time per output token on this Neuron instance (inf2.xlarge, ...)\n";

struct Usage : UserError {
  using UserError::UserError;
};

struct ServeCli {
  std::string checkpoint, hf, tokenizer, chat_template, instance;
  inference::EngineOptions engine;
  inference::server::ServerOptions server;
  int tp = 1;
};

int64_t to_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  try {
    return io::parse_int(v, lo, hi, flag, "nxd-serve");
  } catch (const ConfigError& e) {
    throw Usage(e.what());
  }
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
    else if (a == "--instance")
      c.instance = v;
    else
      throw Usage(str("unknown flag '", a, "'"));
  }
  if (c.checkpoint.empty() == c.hf.empty()) throw Usage("give one of --checkpoint DIR or --hf DIR");
  if (c.tp != 1)
    throw Usage(str("--tp ", c.tp,
                    ": nxd-serve's engine serves at TP 1 only (tensor parallel serving is not "
                    "built yet)"));
  if (c.engine.kv_blocks > 0 && c.engine.kv_memory_bytes > 0)
    throw Usage("give one of --kv-blocks or --kv-memory, not both");
  if (c.server.served_model_name.empty())
    c.server.served_model_name = fs::path(c.hf.empty() ? c.checkpoint : c.hf).filename().string();
  if (c.server.served_model_name.empty()) c.server.served_model_name = "nxd";
  return c;
}

// The model with its weights (TP 1) and its config.
std::shared_ptr<CausalLM> load_model(const ServeCli& c, ModelConfig& cfg) {
  std::shared_ptr<CausalLM> m;
  if (!c.checkpoint.empty()) {
    const fs::path tag_dir = ckpt::resolve_checkpoint(c.checkpoint);
    const auto meta = ckpt::read_metadata(tag_dir);
    if (!meta.contains("model_config"))
      throw ckpt::CheckpointError(str("[nxd-serve] ", tag_dir.string(),
                                      " records no model_config (not a CausalLM checkpoint)"));
    cfg = ckpt::model_config_from_json(meta["model_config"]);
    cfg.sequence_parallel = false;
    cfg.dropout = 0.0;
    cfg.validate();
    m = make_causal_lm(cfg, 0);
    ckpt::LoadOptions lo;
    lo.tag = tag_dir.filename().string();
    ckpt::load_checkpoint(tag_dir.parent_path(), m.get(), nullptr, nullptr, lo);
  } else {
    cfg = ckpt::read_hf_config(c.hf);
    cfg.sequence_parallel = false;
    cfg.dropout = 0.0;
    cfg.validate();
    const auto full = ckpt::read_hf_weights(c.hf, cfg);
    m = make_causal_lm(cfg, 0);
    ckpt::load_full_tensors({m.get()}, full, c.hf);
  }
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

int run(int argc, char** argv) {
  ServeCli c = parse_args(argc, argv);
  io::check_environment();
  std::string tok_path = c.tokenizer;
  if (tok_path.empty() && !c.hf.empty() && fs::is_regular_file(fs::path(c.hf) / "tokenizer.json"))
    tok_path = (fs::path(c.hf) / "tokenizer.json").string();
  if (!c.hf.empty() && !fs::is_directory(c.hf)) throw Usage(str("--hf ", c.hf, ": no such folder"));
  if (tok_path.empty())
    throw Usage(str("no tokenizer: give --tokenizer PATH (a transformers tokenizer.json)",
                    c.hf.empty() ? "" : "; --hf's folder has no tokenizer.json"));
  auto tok = std::make_shared<const io::Tokenizer>(io::Tokenizer::from_file(tok_path));
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
  ModelConfig cfg;
  auto model = load_model(c, cfg);
  if (tok->vocab_size() > cfg.vocab_size)
    throw ConfigError(str("[nxd-serve] the tokenizer ", tok_path, " has ", tok->vocab_size(),
                          " ids but the model's vocab_size is ", cfg.vocab_size));
  c.engine.eos_token_ids = eos_ids(folder, tok.get(), tpl.get());
  inference::Engine engine(model, tok, c.engine);
  c.server.vocab_size = cfg.vocab_size;
  if (!c.instance.empty()) {
    InferenceModelOptions probe;  // an unknown instance is a user mistake found now
    probe.instance = c.instance;
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
  inference::server::Server server(engine, tok, tpl, c.server);
  server.start();
  const auto st = engine.stats();
  std::printf(
      "nxd-serve: serving '%s' on http://%s:%d (max_model_len %lld, %lld KV blocks of %lld, "
      "chat template: %s, EOS ids: %zu)\n",
      c.server.served_model_name.c_str(), c.server.host.c_str(), server.port(),
      (long long)engine.max_model_len(), (long long)st.kv_blocks_total,
      (long long)c.engine.block_size, tpl ? tpl->origin().c_str() : "none",
      c.engine.eos_token_ids.size());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  std::printf("nxd-serve: %s: stopping (new requests 503, in-flight ones get %.0f s)\n",
              sig == SIGTERM ? "SIGTERM" : "SIGINT", c.server.shutdown_grace_s);
  std::fflush(stdout);
  server.stop();
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

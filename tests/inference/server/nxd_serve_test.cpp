// nxd-serve, the program: user mistakes exit with code 2 and a message naming the value; it serves
// a transformers folder (tokens equal the engine's on the same weights, usage carries the
// modeled latency with --instance) and stops on SIGTERM with code 0.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fstream>
#include <regex>
#include <thread>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/checkpoint/quantized.h"
#include "nxd/inference/server/openai_response.h"
#include "nxd/layers/models/quantize_lm.h"
#include "serve_fixture.h"
#include "support/proc.h"

using namespace nxd;
using namespace nxd::testing;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

ProcResult serve(std::vector<std::string> args, const fs::path& dir) {
  args.insert(args.begin(), NXD_SERVE_BIN);
  return run_process(args, dir, std::chrono::seconds(60));
}

// A tiny Llama saved as a transformers folder (d/hf) with the fixture's tokenizer files.
struct HfModel {
  ScratchDir dir{"nxd_serve_cli_"};
  std::shared_ptr<CausalLM> model;
  std::shared_ptr<const io::Tokenizer> tok;
  HfModel() {
    const fs::path hf = dir.path / "hf";
    fs::create_directories(hf);
    write_model_folder(hf);
    tok = std::make_shared<const io::Tokenizer>(
        io::Tokenizer::from_file((hf / "tokenizer.json").string()));
    ModelConfig c = tiny_model("llama");
    c.vocab_size = (tok->vocab_size() + 1) / 2 * 2;  // splits over TP 2
    c.max_position_embeddings = 64;
    model = make_causal_lm(c, 5);
    ckpt::save_checkpoint(dir.path / "run", "step_1", model.get(), nullptr, nullptr);
    ckpt::export_hf(dir.path / "run/step_1", dir.path / "export");
    for (const auto& f : fs::directory_iterator(dir.path / "export"))
      fs::copy_file(f.path(), hf / f.path().filename(), fs::copy_options::overwrite_existing);
  }
};

TEST(NxdServe, UserMistakesExitWithCode2NamingTheValue) {
  HfModel m;
  const fs::path& d = m.dir.path;
  const std::string hf = (d / "hf").string();
  httplib::Server taken;
  const int busy_port = taken.bind_to_any_port("127.0.0.1");
  ASSERT_GT(busy_port, 0);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "give one of --checkpoint DIR or --hf DIR"},
      {{"--hf", hf, "--tp", "3"}, "3"},
      {{"--hf", hf, "--port", "70000"}, "--port"},
      {{"--hf", hf, "--kv-blocks", "8", "--kv-memory", "1M"}, "not both"},
      {{"--hf", hf, "--max-num-seqs", "0"}, "--max-num-seqs"},
      {{"--hf", hf, "--bogus", "1"}, "unknown flag '--bogus'"},
      {{"--hf", hf, "--chunked-prefill", "yes"}, "--chunked-prefill yes: expected on or off"},
      {{"--hf", hf, "--prefix-caching", "1"}, "--prefix-caching 1: expected on or off"},
      {{"--hf", hf, "--prefill-calls", "one"},
       "--prefill-calls one: expected per_request or batched"},
      {{"--hf", (d / "nothing").string()}, "nothing"},
      {{"--hf", hf, "--chat-template", (d / "missing.jinja").string()}, "missing.jinja"},
      {{"--hf", hf, "--instance", "inf9.huge", "--port", "0"}, "inf9.huge"},
      {{"--hf", hf, "--port", std::to_string(busy_port)},
       "cannot listen on 127.0.0.1:" + std::to_string(busy_port)},
      {{"--hf", hf, "--tp", "2", "--port", std::to_string(busy_port)},
       "cannot listen on 127.0.0.1:" + std::to_string(busy_port)},
  };
  for (const auto& [args, says] : cases) {
    const ProcResult r = serve(args, d);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << "want: " << says << "\ngot: " << r.err;
    EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
  }
}

// nxd-serve started in the background with `args`; port() waits for its "serving" line.
struct Running {
  pid_t pid = -1;
  std::string out, err;
  Running(const fs::path& d, std::vector<std::string> args)
      : out((d / "serve.out").string()), err((d / "serve.err").string()) {
    args.insert(args.begin(), NXD_SERVE_BIN);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
  }
  int port() {
    const std::regex on(R"(on http://127\.0\.0\.1:(\d+) )");
    for (int i = 0; i < 1200; ++i) {
      std::smatch mt;
      const std::string text = slurp(out);
      if (std::regex_search(text, mt, on)) return std::stoi(mt[1]);
      if (waitpid(pid, nullptr, WNOHANG) == pid) return 0;  // it ended
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return 0;
  }
  // SIGTERM, then its exit code (-1 if it had not ended within 20 s: then killed)
  int terminate() {
    const auto t0 = std::chrono::steady_clock::now();
    kill(pid, SIGTERM);
    int st = 0;
    pid_t w = 0;
    while ((w = waitpid(pid, &st, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (w == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  ~Running() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// The engine's greedy text for `prompt` on m's weights (or `model`'s), in this process.
std::string engine_text(const HfModel& m, const std::string& prompt, int64_t max_tokens,
                        std::shared_ptr<CausalLM> model = nullptr) {
  inference::Engine e(model ? model : m.model, m.tok, {});
  inference::Request q;
  q.prompt = m.tok->encode(prompt);
  q.sampling.temperature = 0;
  q.stop.max_tokens = max_tokens;
  std::string text;
  e.submit(q, [&](const inference::Output& o) { text += o.text; });
  e.run_until_idle();
  return inference::server::valid_utf8(text);
}

// POST /v1/completions to the server on `port`: greedy, max_tokens.
Reply greedy_completion(int port, const std::string& prompt, int64_t max_tokens) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60);
  return post(c, "/v1/completions",
              json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}}.dump());
}

TEST(NxdServe, ServesAFolderAndStopsOnSigterm) {
  HfModel m;
  const fs::path& d = m.dir.path;
  Running srv(d, {"--hf", (d / "hf").string(), "--port", "0", "--instance", "inf2.xlarge"});
  const int port = srv.port();
  ASSERT_GT(port, 0) << slurp(srv.out) << slurp(srv.err);
  const std::string out = srv.out, err = srv.err;
  EXPECT_NE(slurp(out).find("chat template: "), std::string::npos) << slurp(out);
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30);
  const std::string prompt = "the cat sat";
  const Reply r = post(c, "/v1/completions",
                       json{{"prompt", prompt}, {"max_tokens", 9}, {"temperature", 0}}.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  // the same weights in this process: the engine's greedy text
  EXPECT_EQ(r.json["choices"][0]["text"], engine_text(m, prompt, 9));
  const json& modeled = r.json["usage"]["modeled"];
  EXPECT_EQ(modeled["instance"], "inf2.xlarge") << r.body;
  EXPECT_GT(modeled["ttft_ms"].get<double>(), 0);
  EXPECT_GT(modeled["tpot_ms"].get<double>(), 0);
  const Reply chat = post(c, "/v1/chat/completions",
                          R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})");
  EXPECT_EQ(chat.status, 200) << chat.body;
  // SIGTERM: exits 0 within the bound
  EXPECT_EQ(srv.terminate(), 0) << slurp(err);
  EXPECT_NE(slurp(out).find("SIGTERM: stopping"), std::string::npos) << slurp(out);
  EXPECT_NE(slurp(out).find("nxd-serve: stopped"), std::string::npos) << slurp(out);
}

// --chunked-prefill off reaches the engine: a prompt longer than --max-num-batched-tokens is
// refused (400 naming the budget), which the default (on) serves in chunks.
TEST(NxdServe, ChunkedPrefillOffRefusesAPromptOverTheBudget) {
  HfModel m;
  const fs::path& d = m.dir.path;
  const json body = {{"prompt", std::vector<int64_t>(40, 5)}, {"max_tokens", 2}};
  for (const char* chunked : {"on", "off"}) {
    Running srv(d, {"--hf", (d / "hf").string(), "--port", "0", "--max-num-batched-tokens", "16",
                    "--chunked-prefill", chunked});
    const int port = srv.port();
    ASSERT_GT(port, 0) << slurp(srv.out) << slurp(srv.err);
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30);
    const Reply r = post(c, "/v1/completions", body.dump());
    if (std::string(chunked) == "on") {
      EXPECT_EQ(r.status, 200) << r.body;
    } else {
      EXPECT_EQ(r.status, 400) << r.body;
      EXPECT_NE(r.body.find("max_num_batched_tokens=16"), std::string::npos) << r.body;
    }
    EXPECT_EQ(srv.terminate(), 0) << slurp(srv.err);
  }
}

// --prefix-caching off reaches the engine: a repeated 40-token prompt finds no cached tokens (on:
// its two full 16-position blocks, 32).
TEST(NxdServe, PrefixCachingOffCachesNothing) {
  HfModel m;
  const fs::path& d = m.dir.path;
  const json body = {{"prompt", std::vector<int64_t>(40, 5)}, {"max_tokens", 2}};
  for (const char* caching : {"on", "off"}) {
    Running srv(d, {"--hf", (d / "hf").string(), "--port", "0", "--prefix-caching", caching});
    const int port = srv.port();
    ASSERT_GT(port, 0) << slurp(srv.out) << slurp(srv.err);
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30);
    ASSERT_EQ(post(c, "/v1/completions", body.dump()).status, 200);
    const Reply r = post(c, "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json["usage"]["prompt_tokens_details"]["cached_tokens"],
              std::string(caching) == "on" ? 32 : 0)
        << r.body;
    EXPECT_EQ(srv.terminate(), 0) << slurp(srv.err);
  }
}

// --tp 2: the model's shards on two sim ranks give the single-rank engine's text.
TEST(NxdServe, TensorParallelOverSimRanksGivesTheSingleRankText) {
  HfModel m;
  const fs::path& d = m.dir.path;
  Running srv(d, {"--hf", (d / "hf").string(), "--port", "0", "--tp", "2"});
  const int port = srv.port();
  ASSERT_GT(port, 0) << slurp(srv.out) << slurp(srv.err);
  EXPECT_NE(slurp(srv.out).find("(TP 2,"), std::string::npos) << slurp(srv.out);
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60);
  for (const std::string prompt : {"the cat sat", "a dog ran far away"}) {
    const Reply r = post(c, "/v1/completions",
                         json{{"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json["choices"][0]["text"], engine_text(m, prompt, 10)) << prompt;
  }
  EXPECT_EQ(srv.terminate(), 0) << slurp(srv.err);
  EXPECT_NE(slurp(srv.out).find("nxd-serve: stopped"), std::string::npos) << slurp(srv.out);
}

// --checkpoint: an nxd checkpoint with --tokenizer (its folder's chat template) gives the same
// text.
TEST(NxdServe, ServesACheckpointWithATokenizer) {
  HfModel m;
  const fs::path& d = m.dir.path;
  Running srv(d, {"--checkpoint", (d / "run").string(), "--tokenizer",
                  (d / "hf/tokenizer.json").string(), "--port", "0"});
  const int port = srv.port();
  ASSERT_GT(port, 0) << slurp(srv.out) << slurp(srv.err);
  EXPECT_NE(slurp(srv.out).find("tokenizer_config.json"), std::string::npos) << slurp(srv.out);
  const Reply r = greedy_completion(port, "the cat sat", 10);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["choices"][0]["text"], engine_text(m, "the cat sat", 10));
  EXPECT_EQ(srv.terminate(), 0) << slurp(srv.err);
}

// --draft-model: the model's own checkpoint as its draft serves the engine's greedy text with every
// proposal accepted (/metrics), at --tp 1 and 2; a draft of another vocabulary exits 2 naming
// both sizes.
TEST(NxdServe, SpeculativeDecodingWithADraftModel) {
  HfModel m;
  const fs::path& d = m.dir.path;
  Running srv(d, {"--hf", (d / "hf").string(), "--draft-model", (d / "run").string(), "--speculate",
                  "3", "--port", "0"});
  const int port = srv.port();
  ASSERT_GT(port, 0) << slurp(srv.out) << slurp(srv.err);
  EXPECT_NE(slurp(srv.out).find("speculative decoding: draft"), std::string::npos);
  const Reply r = greedy_completion(port, "the cat sat", 12);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["choices"][0]["text"], engine_text(m, "the cat sat", 12));
  httplib::Client cl("127.0.0.1", port);
  const auto metrics = cl.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("nxd_serve_spec_acceptance_rate 1\n"), std::string::npos)
      << metrics->body;
  EXPECT_EQ(metrics->body.find("nxd_serve_spec_proposed_tokens_total 0\n"), std::string::npos);
  EXPECT_EQ(srv.terminate(), 0) << slurp(srv.err);
  // --tp 2: the model verifies over two sim ranks, the TP 1 draft runs on rank 0
  Running tp2(d, {"--hf", (d / "hf").string(), "--draft-model", (d / "run").string(), "--tp", "2",
                  "--port", "0"});
  ASSERT_GT(tp2.port(), 0) << slurp(tp2.out) << slurp(tp2.err);
  EXPECT_NE(slurp(tp2.out).find("(TP 2,"), std::string::npos) << slurp(tp2.out);
  const Reply r2 = greedy_completion(tp2.port(), "the cat sat", 12);
  ASSERT_EQ(r2.status, 200) << r2.body;
  EXPECT_EQ(r2.json["choices"][0]["text"], engine_text(m, "the cat sat", 12));
  EXPECT_EQ(tp2.terminate(), 0) << slurp(tp2.err);
  ModelConfig c = tiny_model("llama");
  c.vocab_size = 96;
  auto other = make_causal_lm(c, 5);
  ckpt::save_checkpoint(d / "other", "step_1", other.get(), nullptr, nullptr);
  const ProcResult bad = serve(
      {"--hf", (d / "hf").string(), "--draft-model", (d / "other").string(), "--port", "0"}, d);
  EXPECT_EQ(bad.code, 2) << bad.out << bad.err;
  EXPECT_NE(bad.err.find("has vocab_size 96, the model has " +
                         std::to_string(m.model->config().vocab_size)),
            std::string::npos)
      << bad.err;
  const ProcResult lone = serve({"--hf", (d / "hf").string(), "--speculate", "2"}, d);
  EXPECT_EQ(lone.code, 2);
  EXPECT_NE(lone.err.find("--speculate K needs --draft-model DIR"), std::string::npos) << lone.err;
}

// A model nxd-train trained without a tokenizer (data.tokenizer null: UTF-8 bytes are the ids,
// vocab_size >= 256), its run folder given as --checkpoint: /v1/completions answers the engine's
// text over byte ids; chat has no template and answers 400; a vocabulary under 256 exits 2.
TEST(NxdServe, ServesAByteLevelRunFolder) {
  ScratchDir dir{"nxd_serve_bytes_"};
  const fs::path& d = dir.path;
  ModelConfig c = tiny_model("llama");
  c.vocab_size = 260;  // bytes, and ids past them the text leaves out
  c.max_position_embeddings = 64;
  auto model = make_causal_lm(c, 7);
  ckpt::save_checkpoint(d / "run/checkpoints", "step_3", model.get(), nullptr, nullptr);
  Running srv(d, {"--checkpoint", (d / "run").string(), "--port", "0"});
  const int port = srv.port();
  ASSERT_GT(port, 0) << slurp(srv.out) << slurp(srv.err);
  EXPECT_NE(slurp(srv.out).find("tokenizer: bytes"), std::string::npos) << slurp(srv.out);
  const std::string prompt = "Once upon a time";
  const Reply r = greedy_completion(port, prompt, 12);
  ASSERT_EQ(r.status, 200) << r.body;
  auto bytes = std::make_shared<const io::Tokenizer>(io::Tokenizer::bytes());
  inference::Engine e(model, bytes, {});
  inference::Request q;
  for (unsigned char ch : prompt) q.prompt.push_back(ch);
  EXPECT_EQ(bytes->encode(prompt), q.prompt);
  q.sampling.temperature = 0;
  q.stop.max_tokens = 12;
  std::string text;
  std::vector<int64_t> ids;
  e.submit(q, [&](const inference::Output& o) {
    text += o.text;
    ids.insert(ids.end(), o.ids.begin(), o.ids.end());
  });
  e.run_until_idle();
  EXPECT_EQ(r.json["choices"][0]["text"], inference::server::valid_utf8(text));
  EXPECT_EQ(r.json["usage"]["prompt_tokens"], static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(r.json["usage"]["completion_tokens"], static_cast<int64_t>(ids.size()));
  httplib::Client cl("127.0.0.1", port);
  cl.set_read_timeout(60);
  const Reply chat = post(
      cl, "/v1/chat/completions",
      json{{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 4}}
          .dump());
  EXPECT_EQ(chat.status, 400) << chat.body;
  EXPECT_EQ(srv.terminate(), 0) << slurp(srv.err);
  // a vocabulary too small for bytes
  c.vocab_size = 200;
  auto small = make_causal_lm(c, 7);
  ckpt::save_checkpoint(d / "small", "step_1", small.get(), nullptr, nullptr);
  const ProcResult bad = serve({"--checkpoint", (d / "small").string(), "--port", "0"}, d);
  EXPECT_EQ(bad.code, 2) << bad.out << bad.err;
  EXPECT_NE(bad.err.find("vocab_size >= 256, the model has 200"), std::string::npos) << bad.err;
}

// A quantized checkpoint (nxd-ckpt quantize) and --quantize at load serve the text of the
// engine on the model quantized in this process, with the output head unquantized and quantized
// (":head"); --quantize on a quantized checkpoint exits 2.
TEST(NxdServe, ServesAQuantizedCheckpointAndQuantizesAtLoad) {
  HfModel m;
  const fs::path& d = m.dir.path;
  const std::string tok = (d / "hf/tokenizer.json").string(), q = (d / "q8").string();
  for (const std::string spec : {"int8", "int8:head"}) {
    const std::string file = (d / ("q_" + spec.substr(spec.size() - 4))).string();
    ckpt::quantize_checkpoint(d / "run/step_1", file, parse_weight_quant(spec));
    auto quantized = make_causal_lm(m.model->config(), 5);
    quantize_causal_lm(*quantized, {}, parse_weight_quant(spec));
    const std::string want = engine_text(m, "the cat sat", 10, quantized);
    for (const std::vector<std::string>& source :
         {std::vector<std::string>{"--checkpoint", file},
          std::vector<std::string>{"--checkpoint", (d / "run").string(), "--quantize", spec}}) {
      std::vector<std::string> args = source;
      for (const char* a : {"--tokenizer", tok.c_str(), "--port", "0"}) args.push_back(a);
      Running srv(d, args);
      const int port = srv.port();
      ASSERT_GT(port, 0) << slurp(srv.out) << slurp(srv.err);
      const Reply r = greedy_completion(port, "the cat sat", 10);
      ASSERT_EQ(r.status, 200) << r.body;
      EXPECT_EQ(r.json["choices"][0]["text"], want) << spec << " " << source.back();
      EXPECT_EQ(srv.terminate(), 0) << slurp(srv.err);
    }
  }
  ckpt::quantize_checkpoint(d / "run/step_1", q, parse_weight_quant("int8"));
  for (const auto& [args, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--checkpoint", q, "--tokenizer", tok, "--quantize", "int4"},
            "--quantize int4 (groups of 32, symmetric) on --checkpoint " + q +
                ", which is quantized already (int8)"},
           {{"--checkpoint", q, "--tokenizer", tok, "--quantize", "int2"},
            "--quantize: unknown weight format 'int2'"}}) {
    const ProcResult r = serve(args, d);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  }
}

}  // namespace

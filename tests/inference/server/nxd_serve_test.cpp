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
#include "nxd/inference/server/openai_response.h"
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
    c.vocab_size = tok->vocab_size();
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
      {{"--hf", hf, "--tp", "2"}, "--tp 2: nxd-serve's engine serves at TP 1 only"},
      {{"--hf", hf, "--port", "70000"}, "--port"},
      {{"--hf", hf, "--kv-blocks", "8", "--kv-memory", "1M"}, "not both"},
      {{"--hf", hf, "--max-num-seqs", "0"}, "--max-num-seqs"},
      {{"--hf", hf, "--bogus", "1"}, "unknown flag '--bogus'"},
      {{"--hf", (d / "nothing").string()}, "nothing"},
      {{"--hf", hf, "--chat-template", (d / "missing.jinja").string()}, "missing.jinja"},
      {{"--hf", hf, "--instance", "inf9.huge", "--port", "0"}, "inf9.huge"},
      {{"--hf", hf, "--port", std::to_string(busy_port)},
       "cannot listen on 127.0.0.1:" + std::to_string(busy_port)},
  };
  for (const auto& [args, says] : cases) {
    const ProcResult r = serve(args, d);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << "want: " << says << "\ngot: " << r.err;
    EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
  }
}

TEST(NxdServe, ServesAFolderAndStopsOnSigterm) {
  HfModel m;
  const fs::path& d = m.dir.path;
  const std::string out = (d / "serve.out").string(), err = (d / "serve.err").string();
  const std::vector<std::string> argv = {NXD_SERVE_BIN, "--hf",       (d / "hf").string(), "--port",
                                         "0",           "--instance", "inf2.xlarge"};
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  int port = 0;
  const std::regex on(R"(on http://127\.0\.0\.1:(\d+) )");
  for (int i = 0; i < 600 && port == 0; ++i) {
    std::smatch mt;
    const std::string text = slurp(out);
    if (std::regex_search(text, mt, on))
      port = std::stoi(mt[1]);
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (port == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    FAIL() << slurp(out) << slurp(err);
  }
  EXPECT_NE(slurp(out).find("chat template: "), std::string::npos) << slurp(out);
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30);
  const std::string prompt = "the cat sat";
  const Reply r = post(c, "/v1/completions",
                       json{{"prompt", prompt}, {"max_tokens", 9}, {"temperature", 0}}.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  // the same weights in this process: the engine's greedy text
  inference::Engine e(m.model, m.tok, {});
  inference::Request q;
  q.prompt = m.tok->encode(prompt);
  q.sampling.temperature = 0;
  q.stop.max_tokens = 9;
  std::string want;
  inference::FinishReason fin = inference::FinishReason::none;
  e.submit(q, [&](const inference::Output& o) {
    want += o.text;
    fin = o.finish;
  });
  e.run_until_idle();
  EXPECT_EQ(r.json["choices"][0]["text"], inference::server::valid_utf8(want));
  EXPECT_EQ(r.json["choices"][0]["finish_reason"], inference::openai_finish_reason(fin));
  const json& modeled = r.json["usage"]["modeled"];
  EXPECT_EQ(modeled["instance"], "inf2.xlarge") << r.body;
  EXPECT_GT(modeled["ttft_ms"].get<double>(), 0);
  EXPECT_GT(modeled["tpot_ms"].get<double>(), 0);
  const Reply chat = post(c, "/v1/chat/completions",
                          R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})");
  EXPECT_EQ(chat.status, 200) << chat.body;
  // SIGTERM: exits 0 within the bound
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
    FAIL() << "nxd-serve did not stop within 20 s of SIGTERM";
  }
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << slurp(err);
  EXPECT_NE(slurp(out).find("SIGTERM: stopping"), std::string::npos) << slurp(out);
  EXPECT_NE(slurp(out).find("nxd-serve: stopped"), std::string::npos) << slurp(out);
}

}  // namespace

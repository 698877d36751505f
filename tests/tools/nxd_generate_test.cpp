// nxd-generate end to end: from an nxd checkpoint (Llama, GQA) and from a transformers folder
// (GPT-NeoX), the printed tokens equal CausalLM::generate's with the same options, at TP 1 and 2;
// the report lines; exit code 2 for every user mistake; a tokenizer.json's ids and text; LoRA
// adapters from a checkpoint and from a PEFT folder (--lora). Under
// mpirun (NXD_GENERATE_MPI): the mpi backend at TP 2 gives the same tokens.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <tuple>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/gguf_llama.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/lora_files.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/checkpoint/quantized.h"
#include "nxd/io/crc32c.h"
#include "nxd/io/tokenizer.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/models/quantize_lm.h"
#include "nxd/layers/models/speculative.h"
#include "nxd/optim/optimizer.h"
#include "support/files.h"
#include "support/lora.h"
#include "support/proc.h"
#include "support/tiny_models.h"

#include "nxd_generate_support.h"

namespace {
namespace fs = std::filesystem;
using namespace nxd;
using namespace nxd::testing::generate_tool;
using nxd::testing::run_process;
}  // namespace

#ifndef MPIEXEC
TEST(NxdGenerate, TokensEqualTheLibrarysGenerate) {
  Fixture f;
  const fs::path& d = f.dir.path;
  GenerateOptions g;
  g.max_new_tokens = 12;
  g.temperature = 0;
  const std::string prompt = "Hello, nxd";
  const auto want = f.llama->generate(bytes(prompt), g);
  for (std::string tp : {"1", "2"}) {
    auto r = generate({"--checkpoint", (d / "run").string(), "--prompt", prompt, "--max-new-tokens",
                       "12", "--tp", tp, "--eager"},
                      d);
    ASSERT_EQ(r.code, 0) << r.err;
    if (tp == "2") std::printf("%s", r.out.c_str());
    EXPECT_EQ(tokens_of(r.out), want) << "tp " << tp << "\n" << r.out;
    EXPECT_EQ(r.out.rfind(prompt, 0), 0u) << r.out;  // the text first
    EXPECT_NE(r.out.find("\nprefill: 10 tokens in "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\ndecode: 11 tokens in "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("modeled on inf2.xlarge at TP " + tp + ": time to first token "),
              std::string::npos)
        << r.out;
  }
  // a run folder (nxd-train's --out): its newest complete checkpoint in checkpoints/
  ckpt::save_checkpoint(d / "out/checkpoints", "step_1", f.llama.get(), nullptr, nullptr);
  auto rf = generate({"--checkpoint", (d / "out").string(), "--prompt", prompt, "--max-new-tokens",
                      "12", "--eager"},
                     d);
  ASSERT_EQ(rf.code, 0) << rf.err;
  EXPECT_EQ(tokens_of(rf.out), want) << rf.out;
  // sampling from the transformers folder
  g.temperature = 0.8;
  g.top_k = 40;
  g.top_p = 0.9;
  g.seed = 5;
  auto r = generate(
      {"--hf", (d / "hf").string(), "--prompt", prompt, "--max-new-tokens", "12", "--temperature",
       "0.8", "--top-k", "40", "--top-p", "0.9", "--seed", "5", "--instance", "trn1.2xlarge"},
      d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(tokens_of(r.out), f.neox->generate(bytes(prompt), g)) << r.out;
  EXPECT_NE(r.out.find("modeled on trn1.2xlarge at TP 1"), std::string::npos) << r.out;
  // the same on Trainium2 (a logical NeuronCore at LNC=1) and on the Trn3 Gen1 UltraServer
  // (NeuronCore-v4 at LNC=2): the same tokens, modeled there
  for (const std::string instance : {"trn2.48xlarge:lnc=1", "trn3-gen1"}) {
    r = generate(
        {"--hf", (d / "hf").string(), "--prompt", prompt, "--max-new-tokens", "12", "--temperature",
         "0.8", "--top-k", "40", "--top-p", "0.9", "--seed", "5", "--instance", instance},
        d);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(tokens_of(r.out), f.neox->generate(bytes(prompt), g)) << r.out;
    EXPECT_NE(r.out.find("modeled on " + instance + " at TP 1"), std::string::npos) << r.out;
  }
  // the sequence stops at max_position_embeddings=48 and says so
  r = generate({"--hf", (d / "hf").string(), "--prompt", prompt, "--max-new-tokens", "100"}, d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(tokens_of(r.out).size(), 48u);
  EXPECT_NE(r.out.find("stopped: the sequence reached max_position_embeddings=48"),
            std::string::npos)
      << r.out;
}

// LoRA: a checkpoint with adapters (merged on load, traced) and the base checkpoint with the
// same adapters as a PEFT folder (--lora, at TP 2) give the tokens of the adapted model's own
// generate, which runs the adapters unmerged; the base alone gives others.
TEST(NxdGenerate, LoraAdaptersGenerateAsTheAdaptedModel) {
  Fixture f;
  const fs::path& d = f.dir.path;
  auto adapted = make_causal_lm(byte_model("llama"), 7);  // the base of f.llama (d/run)
  apply_lora(*adapted, nxd::testing::every_projection_lora(), 3);
  nxd::testing::randomize_lora_b(*adapted, 2.0);
  GenerateOptions g;
  g.max_new_tokens = 12;
  g.temperature = 0;
  const std::string prompt = "Hello, nxd";
  const auto want = adapted->generate(bytes(prompt), g);
  ASSERT_NE(want, f.llama->generate(bytes(prompt), g)) << "the adapters change nothing";
  ckpt::save_checkpoint(d / "lora", "step_1", adapted.get(), nullptr, nullptr);
  auto r = generate(
      {"--checkpoint", (d / "lora").string(), "--prompt", prompt, "--max-new-tokens", "12"}, d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(tokens_of(r.out), want) << r.out;
  ckpt::export_lora(d / "lora" / "step_1", d / "peft");
  r = generate({"--checkpoint", (d / "run").string(), "--lora", (d / "peft").string(), "--prompt",
                prompt, "--max-new-tokens", "12", "--tp", "2", "--eager"},
               d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(tokens_of(r.out), want) << r.out;
  r = generate({"--checkpoint", (d / "run").string(), "--lora", (d / "nowhere").string(),
                "--prompt", prompt},
               d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("is not a PEFT adapter folder"), std::string::npos) << r.err;
}

TEST(NxdGenerate, UserMistakesExitTwo) {
  Fixture f;
  const fs::path& d = f.dir.path;
  const std::string ck = (d / "run").string();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--prompt", "x"}, "give one of --checkpoint DIR, --hf DIR or --gguf FILE"},
      {{"--checkpoint", ck, "--hf", ck, "--prompt", "x"}, "give one of"},
      {{"--checkpoint", ck}, "--prompt TEXT is required"},
      {{"--checkpoint", ck, "--prompt", "x", "--tp", "0"}, "--tp needs an integer"},
      {{"--checkpoint", ck, "--prompt", "x", "--top-p", "1.5"}, "--top-p needs a number"},
      {{"--checkpoint", ck, "--prompt", "x", "--temperature", "-1"}, "--temperature"},
      {{"--checkpoint", ck, "--prompt", "x", "--backend", "gpu"}, "--backend must be sim or mpi"},
      {{"--checkpoint", ck, "--prompt", "x", "--instance", "p4d"},
       "unknown instance type 'p4d'; known: trn1.2xlarge"},
      {{"--checkpoint", ck, "--prompt", "x", "--instance", "inf2.xlarge:lnc=1"},
       "exist on Trainium2 and Trainium3 only"},
      {{"--checkpoint", ck, "--prompt", "x", "--instance", "trn3.48xlarge"},
       "'trn3.48xlarge': AWS publishes no Trn3 instance size"},
      {{"--checkpoint", ck, "--prompt", "x", "--tp", "4", "--instance", "inf2.xlarge"},
       "exceeds the 2 NeuronCores of inf2.xlarge"},
      {{"--checkpoint", ck, "--prompt", "x", "--tp", "3"}, "not divisible"},
      {{"--checkpoint", (d / "nothing").string(), "--prompt", "x"}, "nothing"},
      {{"--hf", (d / "run").string(), "--prompt", "x"}, "config.json"},
      {{"--checkpoint", ck, "--prompt", std::string(49, 'a')}, "max_position_embeddings=48"},
      {{"--checkpoint", ck, "--prompt", "x", "--bogus", "1"}, "unknown flag '--bogus'"},
  };
  for (const auto& [args, msg] : cases) {
    auto r = generate(args, d);
    EXPECT_EQ(r.code, 2) << args.back() << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(msg), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  }
}

// Issue 34, case 6: a config.json of a million layers allocated until nxd-generate aborted at
// 3.9 GiB; the closed-form bound on its weights refuses it before anything is read or built.
TEST(NxdGenerate, AMillionLayersAreRefusedBeforeAnythingIsBuilt) {
  Fixture f;
  const fs::path& d = f.dir.path;
  fs::copy(d / "hf", d / "deep", fs::copy_options::recursive);
  nlohmann::json c = nlohmann::json::parse(nxd::testing::slurp(d / "deep/config.json"));
  c["num_hidden_layers"] = 1000000;
  std::ofstream(d / "deep/config.json", std::ios::trunc) << c.dump(1);
  for (const char* mode : {"--eager", "--tp"}) {
    std::vector<std::string> a = {"--hf", (d / "deep").string(), "--prompt", "x"};
    if (std::string(mode) == "--tp")
      a.insert(a.end(), {"--tp", "2"});
    else
      a.push_back(mode);
    auto r = generate(a, d);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    // over the cores' HBM, or this host's RAM (26.7 GiB of f32 weights: which comes first
    // depends on --tp and the host)
    EXPECT_NE(r.err.find("[nxd-generate] the model does not fit"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("its weights alone need at least 2"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("1000000 layers"), std::string::npos) << r.err;
  }
}

// The traced path (the default) against --eager, buckets, and a saved trace run without the
// checkpoint.
TEST(NxdGenerate, TracedSavedAndLoadedEqualEager) {
  Fixture f;
  const fs::path& d = f.dir.path;
  const std::string ck = (d / "run").string(), prompt = "Hello, nxd";
  const std::vector<std::string> common = {"--prompt",      prompt, "--max-new-tokens", "12",
                                           "--temperature", "0.9",  "--seed",           "4"};
  for (std::string tp : {"1", "2"}) {
    auto args = common;
    args.insert(args.end(), {"--checkpoint", ck, "--tp", tp});
    auto eager = args;
    eager.push_back("--eager");
    auto e = generate(eager, d);
    ASSERT_EQ(e.code, 0) << e.err;
    auto traced = args;
    traced.insert(traced.end(), {"--buckets", "16,32", "--save-trace", (d / ("t" + tp)).string()});
    auto t = generate(traced, d);
    ASSERT_EQ(t.code, 0) << t.err;
    EXPECT_EQ(tokens_of(t.out), tokens_of(e.out)) << t.out;
    EXPECT_EQ(tokens_of(t.out).size(), 22u) << t.out;
    auto loaded = common;
    loaded.insert(loaded.end(), {"--load-trace", (d / ("t" + tp)).string(), "--tp", tp});
    auto l = generate(loaded, d);
    ASSERT_EQ(l.code, 0) << l.err;
    EXPECT_EQ(tokens_of(l.out), tokens_of(e.out)) << l.out;
    EXPECT_NE(l.out.find("modeled on inf2.xlarge at TP " + tp), std::string::npos) << l.out;
  }
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--load-trace", (d / "t1").string(), "--checkpoint", ck, "--prompt", "x"},
       "--load-trace runs a saved trace"},
      {{"--load-trace", (d / "t1").string(), "--prompt", "x", "--tp", "2"},
       "traced at TP 1, expected TP 2"},
      {{"--load-trace", (d / "nothing").string(), "--prompt", "x"}, "manifest.json is missing"},
      {{"--checkpoint", ck, "--prompt", "x", "--buckets", "16,x"}, "--buckets needs an integer"},
      {{"--checkpoint", ck, "--prompt", "x", "--buckets", "64"}, "exceeds max_position_embeddings"},
      {{"--checkpoint", ck, "--prompt", std::string(20, 'a'), "--buckets", "16"},
       "larger than every bucket"},
      {{"--checkpoint", ck, "--prompt", "x", "--save-trace", (d / "t1").string()},
       "is not an empty folder"},
      {{"--checkpoint", ck, "--prompt", "x", "--eager", "--buckets", "16"}, "not --eager"},
  };
  for (const auto& [args, msg] : cases) {
    auto r = generate(args, d);
    EXPECT_EQ(r.code, 2) << args.back() << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(msg), std::string::npos) << r.err;
  }
  // Issue 34, case 13: the trace's max_position_embeddings edited to 4096 made a 200-token prompt
  // give 0 tokens, a false "stopped" and exit 0. The manifest's checksum refuses the edit; an
  // edit with the checksum made to match still cannot run a prompt past the decoder's 48
  // positions.
  fs::copy(d / "t1", d / "edited", fs::copy_options::recursive);
  nlohmann::json man = nlohmann::json::parse(nxd::testing::slurp(d / "edited/manifest.json"));
  auto mc = nlohmann::json::parse(man["metadata"]["model_config"].get<std::string>());
  mc["max_position_embeddings"] = 4096;
  man["metadata"]["model_config"] = mc.dump();
  std::ofstream(d / "edited/manifest.json", std::ios::trunc) << man.dump(1);
  const std::vector<std::string> long_prompt = {"--load-trace", (d / "edited").string(), "--prompt",
                                                std::string(200, 'a')};
  auto r = generate(long_prompt, d);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("edited/manifest.json was edited or is corrupt"), std::string::npos)
      << r.err;
  man.erase("checksum");
  const std::string text = man.dump(1);
  man["checksum"] = io::crc_hex(io::crc32c(text.data(), text.size()));
  std::ofstream(d / "edited/manifest.json", std::ios::trunc) << man.dump(1);
  r = generate(long_prompt, d);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("prompt 0 has 200 tokens, more than the traced decoder's 48 positions"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("stopped"), std::string::npos) << r.out;
}

// A tokenizer.json (the GPT-2 fixture, 557 ids) on a model of 1024 ids: the prompt's ids are the
// Tokenizer's encode, the text its decode of the ids below 557 (the others left out, said so).
TEST(NxdGenerate, TokenizerJsonEncodesThePromptAndDecodesTheText) {
  Fixture f;
  const fs::path& d = f.dir.path;
  const fs::path fx = NXD_TOKENIZER_FIXTURES;
  const std::string gpt2 = (fx / "gpt2.tokenizer.json").string();
  const io::Tokenizer tok = io::Tokenizer::from_file(gpt2);
  ModelConfig cfg = byte_model("llama");
  cfg.vocab_size = 1024;
  auto llama = make_causal_lm(cfg, 11);
  ckpt::save_checkpoint(d / "tok", "step_1", llama.get(), nullptr, nullptr);
  const std::string prompt = "Hello world, it's nxd's tokenizer.";
  const std::vector<int64_t> ids = tok.encode(prompt);
  auto print = [](const char* what, const std::vector<int64_t>& v) {
    std::printf("%s:", what);
    for (int64_t x : v) std::printf(" %lld", (long long)x);
    std::printf("\n");
  };
  print("Tokenizer::encode(prompt)", ids);
  ASSERT_LT(ids.size(), prompt.size());  // merges applied: not bytes
  GenerateOptions g{.max_new_tokens = 12, .temperature = 50.0, .seed = 2};
  auto r = generate({"--checkpoint", (d / "tok").string(), "--prompt", prompt, "--tokenizer", gpt2,
                     "--max-new-tokens", "12", "--temperature", "50", "--seed", "2", "--eager"},
                    d);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<int64_t> got = tokens_of(r.out);
  print("nxd-generate tokens", got);
  ASSERT_GE(got.size(), ids.size()) << r.out;
  EXPECT_EQ(std::vector<int64_t>(got.begin(), got.begin() + ids.size()), ids) << r.out;
  EXPECT_EQ(got, llama->generate(ids, g)) << r.out;
  int64_t left_out = 0;
  const std::string text = tok.decode_model_output(got, left_out);
  EXPECT_EQ(r.out.substr(0, text.size() + 1), text + "\n") << r.out;
  EXPECT_EQ(r.out.rfind(prompt, 0), 0u) << r.out;
  // a near-uniform draw over 1024 ids: some are past the tokenizer's 557
  EXPECT_GT(left_out, 0) << r.out;
  EXPECT_NE(r.out.find(str("\ntext: ", left_out,
                           " generated id(s) >= the tokenizer's 557 left out (model "
                           "vocab_size=1024)")),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\ntokenizer: " + gpt2 + ": byte-level BPE"), std::string::npos) << r.out;
}

// --hf DIR: DIR/tokenizer.json by default (traced path); --tokenizer bytes forces bytes; a
// tokenizer larger than the model (256 ids) and a missing one exit 2.
TEST(NxdGenerate, HfFoldersTokenizerByDefaultAndTokenizerMistakesExitTwo) {
  Fixture f;
  const fs::path& d = f.dir.path;
  const fs::path fx = NXD_TOKENIZER_FIXTURES;
  const std::string gpt2 = (fx / "gpt2.tokenizer.json").string();
  const std::string prompt = "Hello world, it's nxd's tokenizer.";
  const GenerateOptions greedy{.max_new_tokens = 8, .temperature = 0.0};
  // `cfg`'s model (seed) exported as the transformers folder `hf` with the fixture `tokenizer` as
  // its tokenizer.json: --hf generates the model's greedy tokens of the tokenized prompt
  auto hf_folder = [&](const ModelConfig& cfg, uint64_t seed, const std::string& hf,
                       const std::string& tokenizer) {
    auto m = make_causal_lm(cfg, seed);
    ckpt::save_checkpoint(d / (hf + "_ckpt"), "step_1", m.get(), nullptr, nullptr);
    ckpt::export_hf(d / (hf + "_ckpt/step_1"), d / hf);
    fs::copy_file(fx / tokenizer, d / hf / "tokenizer.json");
    const io::Tokenizer tok = io::Tokenizer::from_file((fx / tokenizer).string());
    auto r = generate({"--hf", (d / hf).string(), "--prompt", prompt, "--max-new-tokens", "8"}, d);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(tokens_of(r.out), m->generate(tok.encode(prompt), greedy)) << r.out;
    return std::make_pair(m, r);
  };
  ModelConfig cfg = byte_model("gpt_neox");
  cfg.vocab_size = 1024;
  auto [neox, r] = hf_folder(cfg, 12, "hf2", "neox.tokenizer.json");
  EXPECT_NE(r.out.find("\ntokenizer: " + (d / "hf2/tokenizer.json").string() + ": byte-level BPE"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("(found in --hf's folder; --tokenizer bytes for byte tokens)"),
            std::string::npos)
      << r.out;
  r = generate({"--hf", (d / "hf2").string(), "--prompt", prompt, "--max-new-tokens", "8",
                "--tokenizer", "bytes"},
               d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(tokens_of(r.out), neox->generate(bytes(prompt), greedy)) << r.out;
  EXPECT_NE(r.out.find("\ntokenizer: bytes"), std::string::npos) << r.out;
  // a Mistral folder (sliding window 4 over a prompt of more tokens) with a SentencePiece-style
  // tokenizer.json (byte_fallback), on the traced path
  ModelConfig mc = byte_model("llama");
  mc.arch = "mistral";
  mc.sliding_window = 4;
  mc.vocab_size = 1024;
  r = hf_folder(mc, 13, "hf3", "llama2.tokenizer.json").second;
  EXPECT_NE(r.out.find("SentencePiece-style BPE"), std::string::npos) << r.out;
  // user mistakes: a tokenizer larger than the model (256 ids), a missing file
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--checkpoint", (d / "run").string(), "--prompt", "x", "--tokenizer", gpt2},
       "the tokenizer " + gpt2 + " has 557 ids but the model's vocab_size is 256"},
      {{"--checkpoint", (d / "run").string(), "--prompt", "x", "--tokenizer", gpt2, "--eager"},
       "has 557 ids but the model's vocab_size is 256"},
      {{"--checkpoint", (d / "run").string(), "--prompt", "x", "--tokenizer",
        (d / "none.json").string(), "--eager"},
       "none.json"},
  };
  for (const auto& [args, msg] : cases) {
    auto e = generate(args, d);
    EXPECT_EQ(e.code, 2) << args.back() << "\n" << e.out << e.err;
    EXPECT_NE(e.err.find(msg), std::string::npos) << e.err;
    EXPECT_EQ(e.err.find("internal error"), std::string::npos) << e.err;
  }
}
#else
TEST(NxdGenerateMpi, TpTwoUnderMpirunEqualsTheLibrary) {
  Fixture f;
  const fs::path& d = f.dir.path;
  GenerateOptions g;
  g.max_new_tokens = 10;
  g.temperature = 0.7;
  g.seed = 3;
  auto r =
      generate({"--checkpoint", (d / "run").string(), "--prompt", "mpi prompt", "--max-new-tokens",
                "10", "--temperature", "0.7", "--seed", "3", "--tp", "2", "--backend", "mpi"},
               d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(tokens_of(r.out), f.llama->generate(bytes("mpi prompt"), g)) << r.out;
  r = generate({"--checkpoint", (d / "run").string(), "--prompt", "x", "--backend", "mpi"}, d);
  EXPECT_EQ(r.code, 2) << r.out << r.err;  // --tp 1 but 2 processes
  EXPECT_NE(r.err.find("--tp 1 but mpirun started 2 process(es)"), std::string::npos) << r.err;
  // int8 weights over MPI ranks (row-parallel scales all-reduced): the TP-1 quantized tokens, the
  // report printed once
  auto q = make_causal_lm(byte_model("llama"), 7);
  quantize_causal_lm(*q, bytes("mpi prompt"));
  r = generate({"--checkpoint", (d / "run").string(), "--prompt", "mpi prompt", "--max-new-tokens",
                "10", "--tp", "2", "--backend", "mpi", "--eager", "--quantize", "int8"},
               d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(tokens_of(r.out),
            q->generate(bytes("mpi prompt"), {.max_new_tokens = 10, .temperature = 0}))
      << r.out;
  const auto first = r.out.find("quantized: int8 weights in 14 linear layers");
  EXPECT_NE(first, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("quantized: int8", first + 1), std::string::npos) << r.out;
  // a quantized checkpoint over MPI ranks: the same tokens, its line printed once
  ckpt::quantize_checkpoint(d / "run/step_1", d / "q8", parse_weight_quant("int8"));
  const auto file = generate({"--checkpoint", (d / "q8").string(), "--prompt", "mpi prompt",
                              "--max-new-tokens", "10", "--tp", "2", "--backend", "mpi", "--eager"},
                             d);
  ASSERT_EQ(file.code, 0) << file.err;
  EXPECT_EQ(tokens_of(file.out), tokens_of(r.out)) << file.out;
  const auto line = file.out.find("quantized checkpoint: int8 weights in 14 linear layers");
  EXPECT_NE(line, std::string::npos) << file.out;
  EXPECT_EQ(file.out.find("quantized checkpoint:", line + 1), std::string::npos) << file.out;
}
#endif

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

namespace {
namespace fs = std::filesystem;
using namespace nxd;
using nxd::testing::run_process;

ModelConfig byte_model(const std::string& arch) {
  ModelConfig c = nxd::testing::tiny_model(arch);
  c.vocab_size = 256;
  c.ffn_hidden_size = 48;
  c.max_position_embeddings = 48;
  c.init_std = 0.3;
  return c;
}

nxd::testing::ProcResult generate(const std::vector<std::string>& args, const fs::path& dir) {
  std::vector<std::string> argv;
#ifdef MPIEXEC
  argv = {MPIEXEC, "--allow-run-as-root", "--oversubscribe", "-np", "2"};
#endif
  argv.push_back(NXD_GENERATE_BIN);
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, dir, std::chrono::seconds(120));
}

// The ids of the `tokens:` line.
std::vector<int64_t> tokens_of(const std::string& out) {
  const auto p = out.find("\ntokens:");
  if (p == std::string::npos) return {};
  std::istringstream s(out.substr(p + 8, out.find('\n', p + 1) - p - 8));
  std::vector<int64_t> v;
  for (int64_t x; s >> x;) v.push_back(x);
  return v;
}

std::vector<int64_t> bytes(const std::string& s) {
  std::vector<int64_t> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

// A saved Llama checkpoint (d/run) and a GPT-NeoX transformers folder (d/hf), and the models.
// A fresh scratch folder, removed at the end (the pid keeps other worktrees' runs apart).
struct Scratch {
  fs::path path = nxd::testing::test_temp_dir("nxd_generate_" + std::to_string(::getpid()) + "_");
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

struct Fixture {
  Scratch dir;
  std::shared_ptr<CausalLM> llama = make_causal_lm(byte_model("llama"), 7);
  std::shared_ptr<CausalLM> neox = make_causal_lm(byte_model("gpt_neox"), 8);
  Fixture() {
    ckpt::save_checkpoint(dir.path / "run", "step_1", llama.get(), nullptr, nullptr);
    ckpt::save_checkpoint(dir.path / "neox", "step_1", neox.get(), nullptr, nullptr);
    ckpt::export_hf(dir.path / "neox/step_1", dir.path / "hf");
  }
};

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
  // the same on Trainium2 (a logical NeuronCore at LNC=1): the same tokens, modeled there
  r = generate({"--hf", (d / "hf").string(), "--prompt", prompt, "--max-new-tokens", "12",
                "--temperature", "0.8", "--top-k", "40", "--top-p", "0.9", "--seed", "5",
                "--instance", "trn2.48xlarge:lnc=1"},
               d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(tokens_of(r.out), f.neox->generate(bytes(prompt), g)) << r.out;
  EXPECT_NE(r.out.find("modeled on trn2.48xlarge:lnc=1 at TP 1"), std::string::npos) << r.out;
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
       "exist on Trainium2 instances only"},
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

// --quantize int8: the tokens of the library's quantized model at TP 1 and 2, eager and traced,
// the quality lines and the resident weight bytes; other formats exit 2 naming them.
TEST(NxdGenerate, QuantizeInt8EqualsTheLibraryAndRefusesWhatItDoesNotRun) {
  Fixture f;
  const fs::path& d = f.dir.path;
  const std::string ck = (d / "run").string(), prompt = "Hello, nxd";
  auto q = make_causal_lm(byte_model("llama"), 7);
  const QuantizedLmReport rep = quantize_causal_lm(*q, bytes(prompt));
  const auto want = q->generate(bytes(prompt), {.max_new_tokens = 12, .temperature = 0});
  auto r = generate({"--checkpoint", ck, "--prompt", prompt, "--max-new-tokens", "12", "--eager",
                     "--quantize", "int8"},
                    d);
  ASSERT_EQ(r.code, 0) << r.err;
  std::printf("%s", r.out.c_str());
  EXPECT_EQ(tokens_of(r.out), want) << r.out;
  EXPECT_NE(r.out.find("quantized: int8 weights in 14 linear layers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(str("quantized on the prompt (10 tokens): max logit change ",
                           str(std::setprecision(4), rep.max_logit_change))),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("prompt perplexity "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MB resident on rank 0 ("), std::string::npos) << r.out;
  // traced (the default), TP 1 and 2: the graphs replay the eager kernels, the same tokens
  for (const char* tp : {"1", "2"}) {
    r = generate({"--checkpoint", ck, "--prompt", prompt, "--max-new-tokens", "12", "--quantize",
                  "int8", "--tp", tp},
                 d);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(tokens_of(r.out), want) << "traced tp " << tp << r.out;
    EXPECT_NE(r.out.find("quantized: int8 weights in 14 linear layers"), std::string::npos)
        << r.out;
  }
  // TP 2: slices of the same int8 weights, the same tokens
  r = generate({"--checkpoint", ck, "--prompt", prompt, "--max-new-tokens", "12", "--eager",
                "--quantize", "int8", "--tp", "2"},
               d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(tokens_of(r.out), want) << r.out;
  EXPECT_NE(r.out.find("quantized: int8 weights in 14 linear layers"), std::string::npos) << r.out;
  // int4 in groups of 32 with minimums (the model's 32 and 48 inputs: whole groups per rank at
  // TP 2 for 32, a partial group at TP 1 for 48): the library's tokens at TP 1
  auto q4 = make_causal_lm(byte_model("llama"), 7);
  quantize_causal_lm(
      *q4, bytes(prompt),
      QuantizeOptions{
          .format = WeightQuant::int4, .group = 32, .zero = kernels::Int4Zero::asymmetric});
  r = generate({"--checkpoint", ck, "--prompt", prompt, "--max-new-tokens", "12", "--eager",
                "--quantize", "int4:32:asym"},
               d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(tokens_of(r.out), q4->generate(bytes(prompt), {.max_new_tokens = 12, .temperature = 0}))
      << r.out;
  EXPECT_NE(r.out.find("quantized: int4 (groups of 32, asymmetric) weights in 14 linear layers"),
            std::string::npos)
      << r.out;
  const auto traced4 = generate({"--checkpoint", ck, "--prompt", prompt, "--max-new-tokens", "12",
                                 "--quantize", "int4:32:asym"},
                                d);
  ASSERT_EQ(traced4.code, 0) << traced4.err;
  EXPECT_EQ(tokens_of(traced4.out), tokens_of(r.out)) << traced4.out;
  for (const auto& [args, msg] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--quantize", "int3", "--eager"}, "--quantize: unknown weight format 'int3'"},
           {{"--quantize", "int4:48", "--eager"}, "unknown weight format 'int4:48'"}}) {
    std::vector<std::string> a = {"--checkpoint", ck, "--prompt", "x"};
    a.insert(a.end(), args.begin(), args.end());
    r = generate(a, d);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(msg), std::string::npos) << r.err;
  }
}

// A quantized checkpoint (nxd-ckpt quantize) generates the tokens of quantizing at load, at TP 1
// and 2, eager and traced; --quantize on it exits 2 naming both.
TEST(NxdGenerate, QuantizedCheckpointEqualsQuantizingAtLoad) {
  Fixture f;
  const fs::path& d = f.dir.path;
  const std::string ck = (d / "run").string(), q = (d / "q4").string(), prompt = "Hello, nxd";
  ckpt::quantize_checkpoint(d / "run/step_1", q, parse_weight_quant("int4:32:asym"));
  ckpt::quantize_checkpoint(d / "run/step_1", d / "q8", parse_weight_quant("int8"));
  ckpt::quantize_checkpoint(d / "run/step_1", d / "q8h", parse_weight_quant("int8:head"));
  // int4 at TP 1 only: the model's 32 inputs per row-parallel rank at TP 2 are half a group
  for (const auto& [spec, dir, tp, line] :
       std::vector<std::tuple<std::string, std::string, std::string, std::string>>{
           {"int4:32:asym", q, "1", "int4 (groups of 32, asymmetric)"},
           {"int8", (d / "q8").string(), "1", "int8"},
           {"int8", (d / "q8").string(), "2", "int8"},
           {"int8:head", (d / "q8h").string(), "1", "int8, head int8"},
           {"int8:head", (d / "q8h").string(), "2", "int8, head int8"}}) {
    const std::vector<std::string> common = {
        "--prompt", prompt, "--max-new-tokens", "12", "--eager", "--tp", tp};
    std::vector<std::string> a = {"--checkpoint", ck, "--quantize", spec};
    a.insert(a.end(), common.begin(), common.end());
    const auto at_load = generate(a, d);
    ASSERT_EQ(at_load.code, 0) << at_load.err;
    a = {"--checkpoint", dir};
    a.insert(a.end(), common.begin(), common.end());
    const auto file = generate(a, d);
    ASSERT_EQ(file.code, 0) << file.err;
    EXPECT_EQ(tokens_of(file.out), tokens_of(at_load.out)) << file.out << at_load.out;
    EXPECT_FALSE(tokens_of(file.out).empty());
    EXPECT_NE(file.out.find("quantized checkpoint: " + line + " weights in 14 linear layers"),
              std::string::npos)
        << file.out;
    const auto traced = generate(
        {"--checkpoint", dir, "--prompt", prompt, "--max-new-tokens", "12", "--tp", tp}, d);
    ASSERT_EQ(traced.code, 0) << traced.err;
    EXPECT_EQ(tokens_of(traced.out), tokens_of(file.out)) << traced.out;
  }
  // a quantized checkpoint as speculative decoding's draft: greedy output is the model's own
  const auto plain =
      generate({"--checkpoint", ck, "--prompt", prompt, "--max-new-tokens", "12", "--eager"}, d);
  const auto spec = generate({"--checkpoint", ck, "--prompt", prompt, "--max-new-tokens", "12",
                              "--eager", "--draft-model", q, "--speculate", "3"},
                             d);
  ASSERT_EQ(spec.code, 0) << spec.err;
  EXPECT_EQ(tokens_of(spec.out), tokens_of(plain.out)) << spec.out;
  EXPECT_NE(spec.out.find("speculative: k=3"), std::string::npos) << spec.out;
  for (const auto& [args, msg] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--eager", "--quantize", "int8"},
            "--quantize int8 on --checkpoint " + q +
                ", which is quantized already (int4 (groups of 32, asymmetric))"},
           {{"--eager", "--lora", d.string()}, "cannot merge into the quantized checkpoint"}}) {
    std::vector<std::string> a = {"--checkpoint", q, "--prompt", "x"};
    a.insert(a.end(), args.begin(), args.end());
    const auto r = generate(a, d);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(msg), std::string::npos) << r.err;
  }
}

// --quality-report's rows by variant ("fp32", "bf16", "int8", "int8, head int8", "int4 (groups
// of 32, symmetric)", "int4 (groups of 32, symmetric), head int8"): perplexity, mean NLL, max
// logit change; each must count `predicted` positions.
std::map<std::string, std::tuple<double, double, double>> quality_rows(const std::string& out,
                                                                       int64_t predicted) {
  std::map<std::string, std::tuple<double, double, double>> rows;
  const std::regex row(
      R"(\n  (\S[^\n]*?) +perplexity ([0-9.]+) \(mean NLL ([0-9.]+)\), max logit change vs fp32 ([0-9.e+-]+), most likely token unchanged at \d+/(\d+))");
  for (std::sregex_iterator it(out.begin(), out.end(), row), end; it != end; ++it) {
    rows[(*it)[1]] = {std::stod((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4])};
    EXPECT_EQ(std::stoll((*it)[5]), predicted) << (*it)[0];
  }
  return rows;
}

// --quality-report on a tiny model trained (AdamW, 60 steps) on one text and evaluated on another:
// every variant predicts the same targets, the fp32 perplexity is exp(CausalLM::loss) (the
// trainer's loss) over the same windows, int8 changes the logits less than int4, quantizing the
// output head too moves the logits and the NLL further, everything is finite; mistakes exit 2.
TEST(NxdGenerate, QualityReportOfATrainedModel) {
  Scratch dir;
  const fs::path& d = dir.path;
  const std::string train_text =
      "the cat sat on the mat. the dog sat on the log. a cat and a dog sat on a mat. ";
  const std::string held_out =
      "the dog sat on the mat. a cat sat on the log. the cat and the dog sat on a log. "
      "a dog sat on the cat's mat. the log sat on a dog.";
  ModelConfig cfg = byte_model("llama");
  cfg.hidden_size = 64;  // whole groups of 32 in every linear layer
  cfg.ffn_hidden_size = 128;
  cfg.init_std = 0.02;
  const int64_t W = 32;
  auto m = make_causal_lm(cfg, 11);
  {
    std::vector<optim::NamedParam> ps;
    for (const auto& [n, t] : m->named_parameters()) ps.push_back({n, t});
    optim::AdamW opt(optim::default_param_groups(ps, 1e-2, 0.0));
    const std::vector<int64_t> ids = bytes(train_text + train_text);
    for (int step = 0; step < 60; ++step) {
      const int64_t at = (step * 7) % (static_cast<int64_t>(ids.size()) - W - 1);
      std::vector<int64_t> x(ids.begin() + at, ids.begin() + at + W),
          y(ids.begin() + at + 1, ids.begin() + at + W + 1);
      Tensor loss = m->loss(from_vector(x, {1, W}), from_vector(y, {1, W}));
      opt.zero_grad();
      backward(loss);
      opt.step();
    }
  }
  ckpt::save_checkpoint(d / "run", "step_60", m.get(), nullptr, nullptr);
  std::ofstream(d / "held_out.txt") << held_out;
  // the trainer's loss over the same windows (W + 1 tokens, stride W)
  const std::vector<int64_t> ids = bytes(held_out);
  const int64_t K = (static_cast<int64_t>(ids.size()) - 1) / W;
  std::vector<int64_t> x, y;
  for (int64_t k = 0; k < K; ++k) {
    x.insert(x.end(), ids.begin() + k * W, ids.begin() + k * W + W);
    y.insert(y.end(), ids.begin() + k * W + 1, ids.begin() + k * W + W + 1);
  }
  double want = 0;
  {
    NoGradGuard g;
    want = m->loss(from_vector(x, {K, W}), from_vector(y, {K, W})).item();
  }
  const auto r = generate({"--checkpoint", (d / "run").string(), "--quality-report",
                           (d / "held_out.txt").string(), "--window", std::to_string(W)},
                          d);
  ASSERT_EQ(r.code, 0) << r.err;
  std::printf("%s", r.out.c_str());
  EXPECT_NE(r.out.find(str("held_out.txt: ", ids.size(), " tokens, ", K, " windows of ", W,
                           " targets (", K * W, " predicted per variant")),
            std::string::npos)
      << r.out;
  const auto rows = quality_rows(r.out, K * W);
  ASSERT_EQ(rows.size(), 6u) << r.out;
  for (const auto& [name, v] : rows) EXPECT_TRUE(std::isfinite(std::get<0>(v))) << name;
  EXPECT_NEAR(std::get<1>(rows.at("fp32")), want, 2e-6) << "the trainer's loss";
  EXPECT_NEAR(std::get<0>(rows.at("fp32")), std::exp(want), 1e-5 * std::exp(want));
  EXPECT_EQ(std::get<2>(rows.at("fp32")), 0.0);
  EXPECT_GT(std::get<2>(rows.at("bf16")), 0.0);
  const std::string i4 = "int4 (groups of 32, symmetric)";
  EXPECT_LT(std::get<2>(rows.at("int8")), std::get<2>(rows.at(i4)));
  // the head rows: the same layers plus an int8 head, whose rounding moves every logit
  for (const auto& [base, head] : {std::pair{std::string("int8"), std::string("int8, head int8")},
                                   std::pair{i4, i4 + ", head int8"}}) {
    EXPECT_NE(std::get<1>(rows.at(head)), std::get<1>(rows.at(base))) << head;
    EXPECT_GT(std::get<2>(rows.at(head)), 0.0) << head;
  }
  EXPECT_LT(std::get<2>(rows.at("int8, head int8")), std::get<2>(rows.at(i4 + ", head int8")));
  EXPECT_LT(std::get<0>(rows.at("fp32")), 256.0) << "trained: better than uniform";
  // TP 2 (sim ranks): the same figures within the rounding of the row-parallel sums
  const auto r2 =
      generate({"--checkpoint", (d / "run").string(), "--quality-report",
                (d / "held_out.txt").string(), "--window", std::to_string(W), "--tp", "2"},
               d);
  ASSERT_EQ(r2.code, 0) << r2.err;
  const auto rows2 = quality_rows(r2.out, K * W);
  ASSERT_EQ(rows2.size(), 6u) << r2.out;
  // (bf16: each rank's partial sums are rounded to bf16 before the all-reduce, relative 2^-9
  // per rounding; the f32 variants differ only by the order of f32 sums)
  for (const auto& [name, v] : rows) {
    const double tol = name == "bf16" ? std::ldexp(std::get<1>(v), -8) : 1e-5;
    std::printf("%s: mean NLL at TP 2 - TP 1 = %.3g\n", name.c_str(),
                std::get<1>(rows2.at(name)) - std::get<1>(v));
    EXPECT_NEAR(std::get<1>(rows2.at(name)), std::get<1>(v), tol) << name << " at TP 2";
  }
  // an imported transformers folder (GPT-NeoX)
  auto neox = make_causal_lm(byte_model("gpt_neox"), 8);
  ckpt::save_checkpoint(d / "neox", "step_1", neox.get(), nullptr, nullptr);
  ckpt::export_hf(d / "neox/step_1", d / "hf");
  const auto rh = generate({"--hf", (d / "hf").string(), "--quality-report",
                            (d / "held_out.txt").string(), "--tokenizer", "bytes"},
                           d);
  ASSERT_EQ(rh.code, 0) << rh.err;
  std::printf("%s", rh.out.c_str());
  const auto rowsh = quality_rows(rh.out, 2 * 48);  // 129 tokens: 2 windows of 48
  ASSERT_EQ(rowsh.size(), 6u) << rh.out;
  for (const auto& [name, v] : rowsh) EXPECT_TRUE(std::isfinite(std::get<0>(v))) << name;
  EXPECT_LT(std::get<2>(rowsh.at("int8")), std::get<2>(rowsh.at(i4)));
  for (const auto& [args, msg] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--prompt", "x"}, "it takes no --prompt"},
           {{"--quantize", "int8"}, "--quantize picks its int4 form"},
           {{"--window", "100"}, "--window 100 exceeds max_position_embeddings=48"}}) {
    std::vector<std::string> a = {"--checkpoint", (d / "run").string(), "--quality-report",
                                  (d / "held_out.txt").string()};
    a.insert(a.end(), args.begin(), args.end());
    const auto e = generate(a, d);
    EXPECT_EQ(e.code, 2) << e.out << e.err;
    EXPECT_NE(e.err.find(msg), std::string::npos) << e.err;
  }
  const auto e =
      generate({"--checkpoint", (d / "run").string(), "--window", "8", "--prompt", "x"}, d);
  EXPECT_EQ(e.code, 2);
  EXPECT_NE(e.err.find("--window is an option of --quality-report"), std::string::npos) << e.err;
}

// --draft-model: speculative decoding gives the model's own greedy tokens at TP 1 and 2 (the
// draft a smaller Llama checkpoint, or the model itself: every proposal accepted) and its seeded
// samples are the library's; mistakes exit 2 naming the flag.
TEST(NxdGenerate, SpeculativeDecodingEqualsTheModelAndReportsAcceptance) {
  Fixture f;
  const fs::path& d = f.dir.path;
  ModelConfig dc = byte_model("llama");
  dc.num_layers = 1;
  auto draft = make_causal_lm(dc, 9);
  ckpt::save_checkpoint(d / "draft", "step_1", draft.get(), nullptr, nullptr);
  const std::string ck = (d / "run").string(), prompt = "Hello, nxd";
  const auto want = f.llama->generate(bytes(prompt), {.max_new_tokens = 16, .temperature = 0});
  for (std::string tp : {"1", "2"}) {
    auto r = generate({"--checkpoint", ck, "--prompt", prompt, "--max-new-tokens", "16", "--eager",
                       "--draft-model", (d / "draft").string(), "--speculate", "3", "--tp", tp},
                      d);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(tokens_of(r.out), want) << "tp " << tp << "\n" << r.out;
    EXPECT_NE(r.out.find("speculative: k=3, "), std::string::npos) << r.out;
  }
  auto r = generate({"--checkpoint", ck, "--prompt", prompt, "--max-new-tokens", "16", "--eager",
                     "--draft-model", ck},
                    d);
  ASSERT_EQ(r.code, 0) << r.err;
  std::printf("%s", r.out.c_str());
  EXPECT_EQ(tokens_of(r.out), want) << r.out;
  EXPECT_NE(r.out.find("speculative: k=4, 3 verification steps, 12 of 12 proposed tokens "
                       "accepted (100.0%), 5.00 tokens per step"),
            std::string::npos)
      << r.out;
  const GenerateOptions g{.max_new_tokens = 12, .temperature = 0.9, .top_k = 20, .seed = 4};
  const SpeculativeResult s = speculative_generate(*f.llama, *draft, bytes(prompt), g, {.k = 2});
  r = generate({"--checkpoint", ck, "--prompt", prompt, "--max-new-tokens", "12", "--eager",
                "--draft-model", (d / "draft").string(), "--speculate", "2", "--temperature", "0.9",
                "--top-k", "20", "--seed", "4"},
               d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(tokens_of(r.out), s.sequence) << r.out;
  ModelConfig other = byte_model("llama");
  other.vocab_size = 300;
  auto wide = make_causal_lm(other, 9);
  ckpt::save_checkpoint(d / "wide", "step_1", wide.get(), nullptr, nullptr);
  for (const auto& [args, msg] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--draft-model", ck}, "--draft-model runs on the eager path only"},
           {{"--speculate", "2", "--eager"}, "--speculate K needs --draft-model DIR"},
           {{"--draft-model", ck, "--eager", "--speculate", "0"}, "--speculate"},
           {{"--draft-model", (d / "wide").string(), "--eager"},
            "has vocab_size 300, the model has 256"},
           {{"--draft-model", (d / "nowhere").string(), "--eager"}, "nowhere"}}) {
    std::vector<std::string> a = {"--checkpoint", ck, "--prompt", "x"};
    a.insert(a.end(), args.begin(), args.end());
    r = generate(a, d);
    EXPECT_EQ(r.code, 2) << args.front() << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(msg), std::string::npos) << r.err;
  }
}

// --gguf: a Llama GGUF file (nxd-ckpt export-gguf) generates the checkpoint's tokens, traced and
// eager, exactly for f32 and as the q8_0-rounded model for q8_0; a damaged file exits 2.
TEST(NxdGenerate, GgufFileGeneratesAsTheModel) {
  Fixture f;
  const fs::path& d = f.dir.path;
  const std::string prompt = "Hello, nxd";
  ckpt::export_gguf(d / "run/step_1", d / "m.gguf", {.type = io::GgmlType::f32});
  ckpt::export_gguf(d / "run/step_1", d / "q8.gguf", {.type = io::GgmlType::q8_0});
  const auto want = f.llama->generate(bytes(prompt), {.max_new_tokens = 12, .temperature = 0});
  for (const char* eager : {"--eager", ""}) {
    std::vector<std::string> a = {"--gguf", (d / "m.gguf").string(), "--prompt",
                                  prompt,   "--max-new-tokens",      "12"};
    if (*eager) a.push_back(eager);
    auto r = generate(a, d);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(tokens_of(r.out), want) << r.out;
  }
  // the q8_0 file's weights, its output head kept quantized (requantized to int8 per row)
  auto q8 = make_causal_lm(byte_model("llama"), 1);
  const ckpt::GgufModel g8 = ckpt::read_gguf_model(d / "q8.gguf");
  ckpt::load_full_tensors({q8.get()}, g8.full, "q8.gguf");
  ckpt::load_quantized_head(*q8, *ckpt::gguf_quantized_head(g8, "q8.gguf"));
  ASSERT_TRUE(q8->output_head_weights().int8_weight());
  auto r = generate(
      {"--gguf", (d / "q8.gguf").string(), "--prompt", prompt, "--max-new-tokens", "12", "--eager"},
      d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(tokens_of(r.out), q8->generate(bytes(prompt), {.max_new_tokens = 12, .temperature = 0}))
      << r.out;
  { std::ofstream(d / "cut.gguf", std::ios::binary) << std::string(40, 'G'); }
  r = generate({"--gguf", (d / "cut.gguf").string(), "--prompt", prompt}, d);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("cut.gguf"), std::string::npos) << r.err;
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

// nxd-generate end to end with changed weights: --quantize int8/int4 against the library's
// quantized model, a quantized checkpoint, --quality-report, speculative decoding with
// --draft-model, and a GGUF file.
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
  // --quantize int4:32:q8: the int4 rows with int8 activations (runtime/kernels/gemv_int4.h
  // Int4Activations), against the f32-activation rows above
  const auto rq = generate(
      {"--checkpoint", (d / "run").string(), "--quality-report", (d / "held_out.txt").string(),
       "--window", std::to_string(W), "--quantize", "int4:32:q8"},
      d);
  ASSERT_EQ(rq.code, 0) << rq.err;
  std::printf("%s", rq.out.c_str());
  const auto rowsq = quality_rows(rq.out, K * W);
  ASSERT_EQ(rowsq.size(), 6u) << rq.out;
  const std::string i4q = "int4 (groups of 32, symmetric, int8 activations)";
  for (const auto& [q8, f32] : {std::pair{i4q, i4}, {i4q + ", head int8", i4 + ", head int8"}}) {
    const double dnll = std::get<1>(rowsq.at(q8)) - std::get<1>(rows.at(f32));
    std::printf("%s: mean NLL %.6f, %+.3g against f32 activations; max logit change %.4g (%.4g)\n",
                q8.c_str(), std::get<1>(rowsq.at(q8)), dnll, std::get<2>(rowsq.at(q8)),
                std::get<2>(rows.at(f32)));
    EXPECT_NE(std::get<2>(rowsq.at(q8)), std::get<2>(rows.at(f32))) << "another answer";
    EXPECT_LT(std::abs(dnll), 0.01 * std::get<1>(rows.at(f32))) << q8;
  }
  EXPECT_EQ(std::get<1>(rowsq.at("int8")), std::get<1>(rows.at("int8"))) << "int8 unchanged";
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

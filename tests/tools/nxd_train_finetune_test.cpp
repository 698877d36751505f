// nxd-train and nxd-ckpt end to end for fine-tuning and evaluation: model.init_from from a run
// folder, a checkpoint, an import-hf checkpoint or a transformers folder; --eval's validation
// loss equal to the training run's at the same step; the model keys taken from the source and a
// contradicting one refused; resume_from_checkpoint on a model-only checkpoint; the summary after
// a resume; the sample up to the model's context, every byte on stdout; LoRA fine-tuning exported
// merged and as a PEFT adapter.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/files.h"
#include "support/proc.h"

namespace fs = std::filesystem;

namespace {

using nxd::testing::Csv;
using nxd::testing::ProcResult;
using nxd::testing::read_csv;
using nxd::testing::slurp;

ProcResult run(const char* bin, const std::vector<std::string>& args, const fs::path& dir) {
  std::vector<std::string> argv{bin};
  argv.insert(argv.end(), args.begin(), args.end());
  return nxd::testing::run_process(argv, dir);
}

// A tiny run's configuration at TP 2 on 2 sim ranks; the validation covers the whole split.
fs::path tiny_config(const fs::path& dir) {
  { nxd::testing::tiny_corpus(dir, 200); }
  std::ofstream(dir / "tiny.yaml") << "seed: 7\n"
                                      "trainer: {max_steps: 4, log_every_n_steps: 2, "
                                      "val_check_interval: 4, limit_val_batches: 1000, "
                                      "num_threads: 1}\n"
                                      "data: {path: "
                                   << (dir / "corpus.txt").string()
                                   << ", seq_length: 32, micro_batch_size: 4, "
                                      "global_batch_size: 4, val_fraction: 0.1}\n"
                                      "model: {num_layers: 1, hidden_size: 32, "
                                      "num_attention_heads: 2, optim: {lr: 1.0e-2}}\n"
                                      "generation: {max_new_tokens: 0}\n"
                                      "exp_manager: {create_tensorboard_logger: false, "
                                      "create_checkpoint_callback: true}\n"
                                      "distributed_strategy: {tensor_model_parallel_size: 2}\n"
                                      "backend: {world_size: 2}\n";
  return dir / "tiny.yaml";
}

// The val_loss column of the row at `step` (NaN if none).
double val_loss_at(const fs::path& metrics, int64_t step) {
  const Csv m = read_csv(metrics);  // step,loss,val_loss,...
  EXPECT_EQ(m.header.rfind("step,loss,val_loss,", 0), 0u) << m.header;
  for (const auto& row : m.rows)
    if (row.size() > 2 && std::stoll(row[0]) == step && !row[2].empty()) return std::stod(row[2]);
  return std::nan("");
}

class FineTune : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = nxd::testing::test_temp_dir("nxd_finetune_" + std::to_string(::getpid()) + "_");
    cfg_ = tiny_config(dir_).string();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  ProcResult train(std::vector<std::string> args, const std::string& out) {
    args.insert(args.begin(), {"--config", cfg_, "--out", (dir_ / out).string()});
    return run(NXD_TRAIN_BIN, args, dir_);
  }
  fs::path dir_;
  std::string cfg_;
};

TEST_F(FineTune, EvalOfEverySourceEqualsTheTrainingRunsValidationLoss) {
  ProcResult a = train({}, "a");
  ASSERT_EQ(a.code, 0) << a.err;
  const double want = val_loss_at(dir_ / "a" / "metrics.csv", 4);
  ASSERT_FALSE(std::isnan(want));
  // the run folder (its checkpoints/), at the same layout: the same numbers, bitwise
  ProcResult e = train({"--eval", "--set", "model.init_from=" + (dir_ / "a").string()}, "e1");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("init: weights from the checkpoint"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("fresh optimizer at step 0"), std::string::npos) << e.out;
  EXPECT_EQ(val_loss_at(dir_ / "e1" / "metrics.csv", 0), want);
  EXPECT_NE(e.out.find("perplexity"), std::string::npos) << e.out;
  EXPECT_EQ(e.out.find(", loss "), std::string::npos) << "a 0-step run prints no loss: " << e.out;
  // resuming the checkpoint for evaluation: the same, at the checkpoint's step
  ProcResult r =
      train({"--eval", "--set",
             "exp_manager.resume_from_checkpoint=" + (dir_ / "a" / "checkpoints").string()},
            "e2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(val_loss_at(dir_ / "e2" / "metrics.csv", 4), want);
  EXPECT_FALSE(fs::exists(dir_ / "e2" / "checkpoints")) << "an evaluation saves no checkpoint";
  // export-hf of the run folder, import-hf at TP 1, evaluated at TP 1 on one rank (other
  // reduction orders: close, not bitwise)
  ProcResult x =
      run(NXD_CKPT_BIN, {"export-hf", (dir_ / "a").string(), (dir_ / "hf").string()}, dir_);
  ASSERT_EQ(x.code, 0) << x.err;
  EXPECT_NE(x.out.find("is a run folder"), std::string::npos) << x.out;
  ProcResult i =
      run(NXD_CKPT_BIN, {"import-hf", (dir_ / "hf").string(), (dir_ / "imp").string()}, dir_);
  ASSERT_EQ(i.code, 0) << i.err;
  for (const std::string& src : {(dir_ / "imp" / "imported").string(), (dir_ / "hf").string()}) {
    ProcResult o = train(
        {"--eval", "--set", "model.init_from=" + src, "--set",
         "distributed_strategy.tensor_model_parallel_size=1", "--set", "backend.world_size=1"},
        "e3");
    ASSERT_EQ(o.code, 0) << o.err;
    EXPECT_NEAR(val_loss_at(dir_ / "e3" / "metrics.csv", 0), want, 1e-5 * want) << src;
    fs::remove_all(dir_ / "e3");
  }
  // the whole split's mean over samples: another micro batch size (3 leaves a partial last
  // batch) gives the same loss up to rounding
  ProcResult m3 = train({"--eval", "--set", "model.init_from=" + (dir_ / "a").string(), "--set",
                         "data.micro_batch_size=3", "--set", "data.global_batch_size=6"},
                        "e4");
  ASSERT_EQ(m3.code, 0) << m3.err;
  EXPECT_NEAR(val_loss_at(dir_ / "e4" / "metrics.csv", 0), want, 1e-5 * want);
}

// --eval covers the whole validation split whatever trainer.limit_val_batches says: a limit of
// one batch (the split has more) gives the training run's whole-split loss, bitwise, not the
// first batch's.
TEST_F(FineTune, EvalIgnoresLimitValBatches) {
  ProcResult a = train({}, "a");
  ASSERT_EQ(a.code, 0) << a.err;
  const double whole = val_loss_at(dir_ / "a" / "metrics.csv", 4);
  ASSERT_FALSE(std::isnan(whole));
  ProcResult one = train({"--set", "trainer.limit_val_batches=1"}, "b");
  ASSERT_EQ(one.code, 0) << one.err;
  const double first = val_loss_at(dir_ / "b" / "metrics.csv", 4);
  ASSERT_NE(first, whole) << "the split must hold more than one validation batch";
  ProcResult e = train({"--eval", "--set", "model.init_from=" + (dir_ / "a").string(), "--set",
                        "trainer.limit_val_batches=1"},
                       "e");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_EQ(val_loss_at(dir_ / "e" / "metrics.csv", 0), whole);
}

TEST_F(FineTune, ModelKeysComeFromTheSourceAndAContradictionIsAnError) {
  ASSERT_EQ(train({"--set", "trainer.max_steps=1"}, "a").code, 0);
  ProcResult bad =
      run(NXD_CKPT_BIN, {"export-hf", (dir_ / "a").string(), (dir_ / "hf").string()}, dir_);
  ASSERT_EQ(bad.code, 0) << bad.err;
  // the source's sizes are taken when the keys are at their defaults (the config sets 32 and 1:
  // a config's own value that differs is a contradiction too)
  std::ofstream(dir_ / "plain.yaml") << "data: {path: " << (dir_ / "corpus.txt").string()
                                     << ", seq_length: 32}\n"
                                        "trainer: {max_steps: 0}\n"
                                        "generation: {max_new_tokens: 0}\n"
                                        "backend: {world_size: 1}\n"
                                        "distributed_strategy: {tensor_model_parallel_size: 1}\n";
  ProcResult ok = run(NXD_TRAIN_BIN,
                      {"--config", (dir_ / "plain.yaml").string(), "--out", (dir_ / "p").string(),
                       "--set", "model.init_from=" + (dir_ / "hf").string()},
                      dir_);
  ASSERT_EQ(ok.code, 0) << ok.err;
  const std::string y = slurp(dir_ / "p" / "config.yaml");
  EXPECT_NE(y.find("hidden_size: 32"), std::string::npos) << y;
  EXPECT_NE(y.find("num_layers: 1"), std::string::npos) << y;
  ProcResult no =
      run(NXD_TRAIN_BIN,
          {"--config", (dir_ / "plain.yaml").string(), "--out", (dir_ / "q").string(), "--set",
           "model.init_from=" + (dir_ / "hf").string(), "--set", "model.rope_theta=500000"},
          dir_);
  EXPECT_EQ(no.code, 2) << no.err;
  EXPECT_NE(no.err.find("model.rope_theta=500000.0 contradicts model.init_from"), std::string::npos)
      << no.err;
  EXPECT_NE(no.err.find("rope_theta=10000.0"), std::string::npos) << no.err;
}

// Issue 34, case 17: a model key given at its default value (model.num_layers=4) was silently
// replaced by the source's; a Mixtral source was refused with "model.arch=mixtral needs
// model.moe.num_experts > 0" (its experts were not taken from it).
TEST_F(FineTune, AKeyGivenAtItsDefaultIsHonouredAndAMixtralSourceTakesItsExperts) {
  ASSERT_EQ(train({"--set", "trainer.max_steps=1"}, "a").code, 0);
  std::ofstream(dir_ / "plain.yaml") << "data: {path: " << (dir_ / "corpus.txt").string()
                                     << ", seq_length: 32}\n"
                                        "trainer: {max_steps: 0}\n"
                                        "generation: {max_new_tokens: 0}\n"
                                        "backend: {world_size: 1}\n"
                                        "distributed_strategy: {tensor_model_parallel_size: 1, "
                                        "sequence_parallel: false}\n";
  auto plain = [&](const std::string& out, const std::vector<std::string>& sets) {
    std::vector<std::string> a = {"--config", (dir_ / "plain.yaml").string(), "--out",
                                  (dir_ / out).string()};
    for (const auto& x : sets) a.insert(a.end(), {"--set", x});
    return run(NXD_TRAIN_BIN, a, dir_);
  };
  // the source has 1 layer; 4 is model.num_layers' default, given on purpose
  ProcResult r = plain("d", {"model.init_from=" + (dir_ / "a").string(), "model.num_layers=4"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("model.num_layers=4 contradicts model.init_from"), std::string::npos)
      << r.err;
  // a Mixtral checkpoint as the source: its experts and top_k come with it
  ASSERT_EQ(train({"--set", "trainer.max_steps=1", "--set", "model.arch=mixtral", "--set",
                   "model.moe.num_experts=4", "--set", "model.moe.top_k=1", "--set",
                   "distributed_strategy.sequence_parallel=false"},
                  "mx")
                .code,
            0);
  r = plain("e", {"model.init_from=" + (dir_ / "mx").string()});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string y = slurp(dir_ / "e" / "config.yaml");
  EXPECT_NE(y.find("num_experts: 4"), std::string::npos) << y;
  EXPECT_NE(y.find("top_k: 1"), std::string::npos) << y;
}

TEST_F(FineTune, ResumingAModelOnlyCheckpointSaysToUseInitFrom) {
  ASSERT_EQ(train({"--set", "trainer.max_steps=1"}, "a").code, 0);
  ASSERT_EQ(
      run(NXD_CKPT_BIN, {"export", (dir_ / "a").string(), (dir_ / "m.safetensors").string()}, dir_)
          .code,
      0);
  ASSERT_EQ(run(NXD_CKPT_BIN,
                {"import", (dir_ / "m.safetensors").string(), (dir_ / "imp").string()}, dir_)
                .code,
            0);
  for (const std::string& p :
       {(dir_ / "imp" / "imported").string(), (dir_ / "m.safetensors").string()}) {
    ProcResult r = train({"--set", "exp_manager.resume_from_checkpoint=" + p}, "b");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("set model.init_from=" + p + " instead"), std::string::npos) << r.err;
  }
  // and as init_from it trains, from step 0
  ProcResult f = train({"--set", "model.init_from=" + (dir_ / "m.safetensors").string(), "--set",
                        "trainer.max_steps=2"},
                       "c");
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_NE(f.out.find("init: weights from the exported file"), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("done: 2 steps in"), std::string::npos) << f.out;
}

TEST_F(FineTune, SummaryAfterAResumeCountsOnlyThisRunsSteps) {
  ASSERT_EQ(train({}, "a").code, 0);
  ProcResult r =
      train({"--set", "exp_manager.resume_if_exists=true", "--set", "trainer.max_steps=5"}, "a");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("done: 1 steps (resumed at step 4, now at 5) in"), std::string::npos)
      << r.out;
}

// Undoes the escaping of the sample on stdout (\xNN and \\).
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == '\\') {
      out += '\\';
      ++i;
    } else if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] == 'x') {
      out += static_cast<char>(std::stoi(s.substr(i + 2, 2), nullptr, 16));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

TEST_F(FineTune, SampleFillsTheContextAndStdoutShowsEveryByte) {
  // an untrained model at temperature 1.5 over all 256 bytes: NULs and other control bytes appear
  ProcResult r = train({"--set", "trainer.max_steps=1", "--set", "generation.max_new_tokens=100",
                        "--set", "generation.temperature=1.5", "--set", "generation.top_k=0",
                        "--set", "generation.prompt=Q: "},
                       "s");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string sample = slurp(dir_ / "s" / "sample.txt");
  EXPECT_EQ(sample.size(), 32u) << "prompt + new tokens fill max_position_embeddings=32";
  EXPECT_NE(r.out.find("stopped after 29 of generation.max_new_tokens=100 new tokens: the model's "
                       "context (max_position_embeddings=32) is full"),
            std::string::npos)
      << r.out;
  const size_t at = r.out.find("is full):\n");
  ASSERT_NE(at, std::string::npos);
  std::string shown = r.out.substr(at + 10);
  shown = shown.substr(0, shown.size() - 1);  // the final newline
  EXPECT_EQ(unescape(shown), sample);
  EXPECT_EQ(shown.find('\0'), std::string::npos);
}

// LoRA after pretraining: nxd-train with NxD Training's peft keys from run a's weights prints
// its trainable share and memory; export-hf refuses the adapters unless --merge-lora, and the
// merged export evaluates to the LoRA run's validation loss; export-lora writes PEFT's folder.
TEST_F(FineTune, LoraRunExportsMergedAndAdapterAlone) {
  ASSERT_EQ(train({}, "a").code, 0);
  ProcResult l =
      train({"--set", "model.init_from=" + (dir_ / "a").string(), "--set",
             "model_alignment_strategy.peft.lora_rank=4", "--set",
             "model_alignment_strategy.peft.lora_dropout=0", "--set", "precision.type=fp32"},
            "l");
  ASSERT_EQ(l.code, 0) << l.err;
  EXPECT_NE(l.out.find("lora: rank 4, alpha 32, dropout 0: trainable "), std::string::npos)
      << l.out;
  EXPECT_NE(l.out.find("planned for full fine-tuning"), std::string::npos) << l.out;
  const double want = val_loss_at(dir_ / "l" / "metrics.csv", 4);
  ASSERT_FALSE(std::isnan(want));
  ProcResult no =
      run(NXD_CKPT_BIN, {"export-hf", (dir_ / "l").string(), (dir_ / "hf").string()}, dir_);
  EXPECT_EQ(no.code, 2) << no.err;
  EXPECT_NE(no.err.find("has LoRA adapters: --merge-lora"), std::string::npos) << no.err;
  ProcResult x =
      run(NXD_CKPT_BIN,
          {"export-hf", (dir_ / "l").string(), (dir_ / "hf").string(), "--merge-lora"}, dir_);
  ASSERT_EQ(x.code, 0) << x.err;
  // fp32 both: under autocast (bf16 matmul inputs) W + s B A rounds once where the adapter's
  // path rounds W and B, A apart, and the losses differ by about 1e-5 of their value
  ProcResult e = train({"--eval", "--set", "model.init_from=" + (dir_ / "hf").string(), "--set",
                        "precision.type=fp32"},
                       "e");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NEAR(val_loss_at(dir_ / "e" / "metrics.csv", 0), want, 1e-5 * want);
  ProcResult a =
      run(NXD_CKPT_BIN, {"export-lora", (dir_ / "l").string(), (dir_ / "peft").string()}, dir_);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(slurp(dir_ / "peft" / "adapter_config.json").find("\"peft_type\": \"LORA\""),
            std::string::npos);
  ProcResult none =
      run(NXD_CKPT_BIN, {"export-lora", (dir_ / "a").string(), (dir_ / "p2").string()}, dir_);
  EXPECT_EQ(none.code, 2) << none.err;
  EXPECT_NE(none.err.find("has no LoRA adapters"), std::string::npos) << none.err;
}

TEST(NxdCkptExport, SaysWhenAPathIsNeitherACheckpointNorARunFolder) {
  const fs::path d = nxd::testing::test_temp_dir("nxd_finetune_export_");
  ProcResult r = run(NXD_CKPT_BIN, {"export-hf", d.string(), (d / "out").string()}, d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(
      r.err.find("is neither a checkpoint, a folder of complete checkpoints, nor a run folder"),
      std::string::npos)
      << r.err;
  fs::remove_all(d);
}

}  // namespace

namespace {

// data.tokenizer: the text and the prompt tokenized by a tokenizer.json, the sample decoded.
TEST_F(FineTune, TokenizerTokenizesTheTextAndDecodesTheSample) {
  const std::string tok = std::string(NXD_TOKENIZER_FIXTURES) + "/gpt2.tokenizer.json";
  ProcResult r = train({"--set", "data.tokenizer=" + tok, "--set", "model.vocab_size=560", "--set",
                        "trainer.max_steps=2", "--set", "generation.max_new_tokens=8", "--set",
                        "generation.prompt=The cat"},
                       "t");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(" tokens from 1 file(s) in "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("byte-level BPE from " + tok), std::string::npos) << r.out;
  const std::string sample = slurp(dir_ / "t" / "sample.txt");
  EXPECT_EQ(sample.rfind("The cat", 0), 0u) << sample;
  EXPECT_GT(sample.size(), 8u) << "8 BPE tokens decode to more than 8 bytes here: " << sample;
  ProcResult small =
      train({"--set", "data.tokenizer=" + tok, "--set", "model.vocab_size=256"}, "u");
  EXPECT_EQ(small.code, 2) << small.err;
  EXPECT_NE(small.err.find("has 557 ids but model.vocab_size=256"), std::string::npos) << small.err;
}

}  // namespace

TEST_F(FineTune, SftPackedWithLoraThenDpoFromJsonlAndAJsonlErrorExitsTwo) {
  // NxD Training's keys from the command line: SFT on a jsonl with packing and LoRA at TP 2, its
  // adapters merged by nxd-ckpt, then DPO from the merged weights; a broken jsonl line exits 2
  // naming the file and line
  {
    std::ofstream f(dir_ / "sft.jsonl");
    for (int i = 0; i < 48; ++i)
      f << R"({"prompt": "Q: )" << i % 7 << " plus " << i % 3 << R"(?\nA:", "completion": " )"
        << i % 7 + i % 3 << R"(."})"
        << "\n";
    std::ofstream g(dir_ / "pairs.jsonl");
    for (int i = 0; i < 24; ++i)
      g << R"({"prompt": "sky )" << i % 5 << R"(:", "chosen": " blue", "rejected": " green"})"
        << "\n";
  }
  ProcResult s =
      train({"--set", "data.train_dir=" + (dir_ / "sft.jsonl").string(), "--set",
             "model_alignment_strategy.sft.packing=true", "--set", "data.seq_length=64", "--set",
             "model_alignment_strategy.peft.lora_rank=4", "--set", "precision.type=fp32"},
            "sft");
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_NE(s.out.find("data: sft train: 48 examples in "), std::string::npos) << s.out;
  EXPECT_NE(s.out.find(" real tokens/s ("), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("packing"), std::string::npos) << s.out;
  EXPECT_NE(slurp(dir_ / "sft" / "sft_metrics.csv").find("sft_trained_tokens"), std::string::npos);
  // the adapters merged into the base (a transformers folder), the DPO run's initial weights
  ProcResult m =
      run(NXD_CKPT_BIN,
          {"export-hf", (dir_ / "sft").string(), (dir_ / "merged").string(), "--merge-lora"}, dir_);
  ASSERT_EQ(m.code, 0) << m.err;
  ProcResult d =
      train({"--set", "data.train_dir=" + (dir_ / "pairs.jsonl").string(), "--set",
             "data.alignment_strategy.dpo.kl_beta=0.1", "--set",
             "data.alignment_strategy.dpo.max_dpo_prompt_length=8", "--set",
             "model.init_from=" + (dir_ / "merged").string(), "--set", "precision.type=fp32"},
            "dpo");
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.out.find("dpo: reference log-probabilities of "), std::string::npos) << d.out;
  EXPECT_NE(slurp(dir_ / "dpo" / "dpo_metrics.csv").find("dpo_rewards_accuracy"),
            std::string::npos);
  std::ofstream(dir_ / "bad.jsonl") << R"({"prompt": "a", "completion": "b"})"
                                    << "\n"
                                    << R"({"prompt": "a", "completion": "b")"
                                    << "\n";
  ProcResult b = train({"--set", "data.train_dir=" + (dir_ / "bad.jsonl").string()}, "bad");
  EXPECT_EQ(b.code, 2) << b.err;
  EXPECT_NE(b.err.find("bad.jsonl:2: not JSON"), std::string::npos) << b.err;
}

TEST_F(FineTune, OrpoFromJsonlTrainsAndLogsItsColumnsAndKeyMistakesExitTwo) {
  // nxd-train with NxD Training's model_alignment_strategy.orpo keys on 24 pairs at TP 2, 8
  // steps: the loss falls and orpo_metrics.csv has the ORPO columns; ORPO with a DPO key, and a bad
  // ORPO value, exit 2 naming the keys
  {
    std::ofstream g(dir_ / "pairs.jsonl");
    for (int i = 0; i < 24; ++i)
      g << R"({"prompt": "sky )" << i % 5 << R"(:", "chosen": " blue", "rejected": " green )"
        << i % 3 << R"("})"
        << "\n";
  }
  const std::vector<std::string> base{"--set", "data.train_dir=" + (dir_ / "pairs.jsonl").string(),
                                      "--set", "trainer.max_steps=8",
                                      "--set", "precision.type=fp32"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = base;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  ProcResult o = train(with({"--set", "model_alignment_strategy.orpo.beta=0.1", "--set",
                             "model_alignment_strategy.orpo.max_prompt_length=8", "--set",
                             "model_alignment_strategy.orpo.truncation_mode=keep_end"}),
                       "orpo");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("orpo train: "), std::string::npos) << o.out;
  const Csv side = read_csv(dir_ / "orpo" / "orpo_metrics.csv");
  for (const char* k :
       {"orpo_rewards_chosen", "orpo_rewards_rejected", "orpo_rewards_margin",
        "orpo_rewards_accuracy", "orpo_nll_loss", "orpo_log_odds_ratio", "orpo_log_odds_chosen"})
    EXPECT_NE(side.header.find(k), std::string::npos) << k << " in " << side.header;
  const Csv m = read_csv(dir_ / "orpo" / "metrics.csv");
  ASSERT_GE(m.rows.size(), 2u);
  const double first = std::stod(m.rows.front().at(1)), last = std::stod(m.rows.back().at(1));
  std::printf("  nxd-train ORPO: loss %.4f -> %.4f\n", first, last);
  EXPECT_LT(last, first);
  ProcResult both = train(with({"--set", "model_alignment_strategy.orpo.beta=0.1", "--set",
                                "model_alignment_strategy.dpo.kl_beta=0.1"}),
                          "both");
  EXPECT_EQ(both.code, 2) << both.err;
  EXPECT_NE(both.err.find("model_alignment_strategy.dpo.kl_beta (DPO) and "
                          "model_alignment_strategy.orpo.beta (ORPO) are both set"),
            std::string::npos)
      << both.err;
  ProcResult bad = train(with({"--set", "model_alignment_strategy.orpo.beta=0"}), "bad_beta");
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("model_alignment_strategy.orpo.beta=0 must be > 0"), std::string::npos)
      << bad.err;
  ProcResult mode =
      train(with({"--set", "model_alignment_strategy.orpo.truncation_mode=middle"}), "bad_mode");
  EXPECT_EQ(mode.code, 2) << mode.err;
  EXPECT_NE(mode.err.find("model_alignment_strategy.orpo.truncation_mode"), std::string::npos)
      << mode.err;
}

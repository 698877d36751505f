// Runs the nxd-train binary: a tiny end-to-end training run, reproducibility across runs, and
// the message and exit code 2 of each class of bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "support/files.h"
#include "support/proc.h"

namespace fs = std::filesystem;

namespace {

using nxd::testing::Csv;
using nxd::testing::ProcResult;
using nxd::testing::read_csv;
using nxd::testing::slurp;

fs::path temp_dir() {
  return nxd::testing::test_temp_dir("nxd_train_cli_");
}

ProcResult run(const std::vector<std::string>& args, const fs::path& dir) {
  std::vector<std::string> argv{NXD_TRAIN_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  return nxd::testing::run_process(argv, dir);
}

fs::path tiny_config(const fs::path& dir) {
  { nxd::testing::tiny_corpus(dir, 300); }
  std::ofstream(dir / "tiny.yaml") << "seed: 7\n"
                                      "trainer:\n"
                                      "  max_steps: 30\n"
                                      "  log_every_n_steps: 5\n"
                                      "  val_check_interval: 10\n"
                                      "  limit_val_batches: 2\n"
                                      "  num_threads: 1\n"
                                      "data:\n"
                                      "  path: "
                                   << (dir / "corpus.txt").string()
                                   << "\n"
                                      "  seq_length: 32\n"
                                      "  micro_batch_size: 4\n"
                                      "  global_batch_size: 8\n"
                                      "model:\n"
                                      "  num_layers: 1\n"
                                      "  hidden_size: 32\n"
                                      "  num_attention_heads: 2\n"
                                      "  optim: {lr: 1.0e-2}\n"
                                      "generation: {max_new_tokens: 16}\n"
                                      "distributed_strategy: {tensor_model_parallel_size: 1}\n"
                                      "backend: {world_size: 1}\n";
  return dir / "tiny.yaml";
}

void expect_user_error(const ProcResult& r, const std::string& part) {
  EXPECT_EQ(r.code, 2) << "stderr: " << r.err;
  EXPECT_EQ(r.err.rfind("nxd-train: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(part), std::string::npos) << "stderr: " << r.err << "\nexpected: " << part;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

}  // namespace

TEST(NxdTrain, TinyRunLearnsAndWritesItsFiles) {
  auto d = temp_dir();
  ProcResult r = run({"--config", tiny_config(d).string(), "--out", (d / "out").string()}, d);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* f : {"metrics.csv", "config.yaml", "sample.txt"})
    EXPECT_TRUE(fs::exists(d / "out" / f)) << f;
  Csv m = read_csv(d / "out" / "metrics.csv");
  EXPECT_EQ(m.header.rfind("step,loss,val_loss,lr,grad_norm,tokens_per_s", 0), 0u) << m.header;
  ASSERT_EQ(m.rows.size(), 6u);
  EXPECT_EQ(m.rows.back()[0], "30");
  const double first = std::stod(m.rows.front()[1]), last = std::stod(m.rows.back()[1]);
  EXPECT_LT(last, first - 1.0) << "training loss did not fall";
  EXPECT_EQ(m.rows[0][2], "");  // no validation at step 5
  const double val10 = std::stod(m.rows[1][2]), val30 = std::stod(m.rows[5][2]);
  EXPECT_LT(val30, val10);
  EXPECT_LT(val30, 3.0);
  // not a terminal: plain lines, then the sample
  EXPECT_EQ(r.out.find('\r'), std::string::npos);
  EXPECT_NE(r.out.find("step 30/30"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sample"), std::string::npos) << r.out;
  EXPECT_EQ(slurp(d / "out" / "sample.txt").size(), 7u + 16u);  // "Q: What" + 16 bytes
  // the written config.yaml reproduces the run
  ProcResult again =
      run({"--config", (d / "out" / "config.yaml").string(), "--out", (d / "again").string()}, d);
  ASSERT_EQ(again.code, 0) << again.err;
  Csv m2 = read_csv(d / "again" / "metrics.csv");
  ASSERT_EQ(m2.rows.size(), m.rows.size());
  for (size_t i = 0; i < m.rows.size(); ++i) {
    EXPECT_EQ(m2.rows[i][1], m.rows[i][1]) << "loss, row " << i;  // bitwise: same text
    EXPECT_EQ(m2.rows[i][2], m.rows[i][2]) << "val_loss, row " << i;
  }
}

// An NxD Training-style file: the Neuron/XLA keys are listed once as not applicable and the run
// trains; a Mistral from a transformers config.json (model.model_config: sliding window 8 over
// sequences of 32) on text tokenized by a SentencePiece-style tokenizer.json with byte_fallback.
TEST(NxdTrain, NxdtKeysAreListedOnceAndAMistralTrainsOnSentencePieceText) {
  auto d = temp_dir();
  std::ofstream(d / "config.json") << R"({"model_type": "mistral", "vocab_size": 656,
      "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64,
      "rms_norm_eps": 1e-5, "sliding_window": 8})";
  std::ofstream(d / "nxdt.yaml")
      << "name: hf_mistral\nmodel_source: hf\ncompiler_flags: '--model-type transformer'\n"
         "trainer: {devices: 32, num_nodes: 4, max_steps: 10, max_epochs: -1, num_threads: 1,\n"
         "  log_every_n_steps: 5, val_check_interval: 0, num_sanity_val_steps: 0}\n"
         "exp_manager: {log_parameter_norm: True, exp_dir: null}\n"
         "data: {path: "
      << (d / "corpus.txt").string()
      << ", seq_length: 32, micro_batch_size: 4, global_batch_size: 4,\n"
         "  tokenizer: {type: " NXD_SOURCE_DIR
         "/tests/io/fixtures/tokenizer/llama2.tokenizer.json}}\n"
         "model:\n  model_config: "
      << (d / "config.json").string()
      << "\n  encoder_seq_length: 32\n  fusions: {softmax: True, flash_attention: True}\n"
         "  optim: {lr: 1.0e-2, sched: {max_steps: '${trainer.max_steps}'}}\n"
         "generation: {max_new_tokens: 8}\n"
         "distributed_strategy: {tensor_model_parallel_size: 1}\nbackend: {world_size: 1}\n";
  nxd::testing::tiny_corpus(d, 300);
  const ProcResult r =
      run({"--config", (d / "nxdt.yaml").string(), "--out", (d / "out").string()}, d);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string line = "not applicable in nxd";
  const size_t at = r.out.find(line);
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(line, at + 1), std::string::npos) << "listed once: " << r.out;
  const std::string listed = r.out.substr(at, r.out.find('\n', at) - at);
  for (const char* k :
       {"name", "compiler_flags", "trainer.devices", "trainer.num_nodes",
        "exp_manager.log_parameter_norm", "model.fusions.softmax", "model.fusions.flash_attention"})
    EXPECT_NE(listed.find(k), std::string::npos) << k << " in: " << listed;
  EXPECT_NE(r.out.find("model: mistral"), std::string::npos) << r.out;
  EXPECT_EQ(read_csv(d / "out" / "metrics.csv").rows.size(), 2u);
  // a misspelt key is still an error naming the nearest known one
  std::ofstream(d / "typo.yaml") << "trainer:\n  devices: 8\n  max_step: 5\n";
  expect_user_error(run({"--config", (d / "typo.yaml").string()}, d),
                    "unknown key 'trainer.max_step'");
}

TEST(NxdTrain, HelpAndPrintConfig) {
  auto d = temp_dir();
  ProcResult h = run({"--help"}, d);
  EXPECT_EQ(h.code, 0);
  EXPECT_NE(h.out.find("usage: nxd-train"), std::string::npos);
  ProcResult p = run({"--set", "model.hidden_size=64", "--print-config"}, d);
  EXPECT_EQ(p.code, 0) << p.err;
  EXPECT_NE(p.out.find("  hidden_size: 64\n"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("  num_kv_heads: 4\n"), std::string::npos) << p.out;  // resolved
}

// A 150,000-character value is not echoed whole (issue 34: model.arch, backend.instance,
// data.path, backend.timeline each gave a 150 KB message): the tools print at most 4,096
// characters of a message, saying how long it was.
TEST(NxdTrain, LongValuesAreShortenedInMessages) {
  auto d = temp_dir();
  for (const std::string key :
       {"model.arch", "backend.instance", "data.path", "backend.timeline"}) {
    SCOPED_TRACE(key);
    const std::string section = key.substr(0, key.find('.')), name = key.substr(key.find('.') + 1);
    std::ofstream(d / "long.yaml") << section << ":\n  " << name << ": \""
                                   << std::string(150000, 'x') << "\"\ntrainer:\n  max_steps: 1\n";
    const ProcResult r =
        run({"--config", (d / "long.yaml").string(), "--out", (d / "o").string()}, d);
    expect_user_error(r, " characters)");
    EXPECT_LT(r.err.size(), 4200u) << r.err.substr(0, 200);
  }
}

TEST(NxdTrain, BadInputGivesOneLineAndExitCode2) {
  auto d = temp_dir();
  expect_user_error(run({"--set", "model.hiden_size=64"}, d),
                    "unknown key 'model.hiden_size' (--set model.hiden_size=64); did you mean "
                    "'model.hidden_size'?");
  std::ofstream(d / "bad_key.yaml") << "trainer:\n  max_step: 10\n";
  expect_user_error(run({"--config", (d / "bad_key.yaml").string()}, d),
                    "did you mean 'trainer.max_steps'");
  expect_user_error(run({"--set", "data.micro_batch_size=four"}, d),
                    "data.micro_batch_size: expected an integer, got string \"four\"");
  std::ofstream(d / "bad_type.json") << R"({"model": {"tie_word_embeddings": "yes"}})";
  expect_user_error(run({"--config", (d / "bad_type.json").string()}, d),
                    "model.tie_word_embeddings: expected a boolean (true or false), got string");
  expect_user_error(
      run({"--set", "model.hidden_size=100", "--set", "model.num_attention_heads=8"}, d),
      "model.num_attention_heads=8 does not divide model.hidden_size=100");
  expect_user_error(
      run({"--set", "model.num_attention_heads=8", "--set", "model.num_kv_heads=3"}, d),
      "model.num_kv_heads=3 does not divide model.num_attention_heads=8");
  expect_user_error(
      run({"--set", "data.global_batch_size=24", "--set", "data.micro_batch_size=16"}, d),
      "data.global_batch_size=24 is not a multiple of data.micro_batch_size=16");
  expect_user_error(
      run({"--set", "data.path=" + (d / "no_such_corpus").string(), "--out", (d / "o1").string()},
          d),
      "data.path '" + (d / "no_such_corpus").string() + "' does not exist");
  fs::create_directories(d / "binary_only");
  std::ofstream(d / "binary_only" / "x.dat", std::ios::binary) << std::string("\0\1\2", 3);
  expect_user_error(
      run({"--set", "data.path=" + (d / "binary_only").string(), "--out", (d / "o2").string()}, d),
      "empty corpus");
  expect_user_error(run({"--config", (d / "missing.yaml").string()}, d), "cannot read config file");
  expect_user_error(run({"--frobnicate"}, d), "unknown argument '--frobnicate'");
  expect_user_error(run({"--set", "model.arch=gpt2"}, d), "model.arch=gpt2 is not built in");
  expect_user_error(
      run({"--set", "backend.world_size=6", "--set",
           "distributed_strategy.tensor_model_parallel_size=4"},
          d),
      "world size 6 is not tensor_model_parallel_size 4 x pipeline_model_parallel_size 1");
  expect_user_error(run({"--set", "backend.kind=cuda"}, d), "\"cuda\" is not one of sim, mpi");
  expect_user_error(run({"--set", "distributed_strategy.context_parallel_size=3", "--set",
                         "distributed_strategy.tensor_model_parallel_size=1", "--set",
                         "backend.world_size=3", "--set", "data.seq_length=64"},
                        d),
                    "data.seq_length=64 is not divisible by 2 x "
                    "distributed_strategy.context_parallel_size=6");
  // a text file that is not a config: named with its first line, not its whole content
  std::ofstream(d / "notes.txt") << "remember to buy milk\n" << std::string(500, 'x') << "\n";
  expect_user_error(run({"--config", (d / "notes.txt").string()}, d),
                    "notes.txt is not a configuration: expected a mapping of keys at the top "
                    "level, got text (first line: 'remember to buy milk')");
}

TEST(NxdTrain, ModelThatDoesNotFitIsAUserError) {
  // A 51M-token vocabulary: each rank's shard of the embedding (51e6 x 192 / 2 x 4 bytes = 19.6
  // GB) exceeds the NeuronCore's 16 GiB HBM; the memory plan on meta tensors refuses the run
  // before anything is allocated, naming the rank, its breakdown and the capacity (exit 2), not
  // std::bad_alloc. (Long sequences no longer do it: fused attention's memory grows with S, not
  // S^2.)
  auto d = temp_dir();
  const auto r =
      run({"--set", "model.vocab_size=51000000", "--set", "data.kind=random", "--set",
           "data.random_num_samples=4", "--set", "data.global_batch_size=1", "--set",
           "backend.world_size=2", "--set", "trainer.max_steps=1", "--out", (d / "o").string()},
          d);
  expect_user_error(r, "[plan] the model does not fit: rank 0 (stage 0) needs parameters ");
  EXPECT_NE(r.err.find("over the 16.00 GiB HBM of a trn1.32xlarge NeuronCore"), std::string::npos)
      << r.err;
}

// Issue 34, case 6: a million layers printed nothing and grew to 2.5 GiB in 90 s while the plan
// built them on meta tensors; the closed-form bound on the parameters refuses them first.
TEST(NxdTrain, AMillionLayersAreRefusedBeforePlanning) {
  auto d = temp_dir();
  const auto r = run({"--set", "model.num_layers=1000000", "--set", "data.kind=random", "--set",
                      "trainer.max_steps=1", "--out", (d / "o").string()},
                     d);
  expect_user_error(r, "does not fit");
  EXPECT_NE(r.err.find("found before planning: model.num_layers=1000000"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("memory plan ("), std::string::npos) << r.out;  // nothing was planned
}

// TP=2 x DP=2 on the sim backend, twice: bitwise the same losses, norms, modeled times, sample.
TEST(NxdTrain, SimParallelRunIsDeterministic) {
  auto d = temp_dir();
  const std::vector<std::string> args{
      "--config", tiny_config(d).string(),
      "--set",    "trainer.max_steps=10",
      "--set",    "backend.world_size=4",
      "--set",    "distributed_strategy.tensor_model_parallel_size=2",
      "--set",    "distributed_strategy.sequence_parallel=true",
      "--set",    "data.micro_batch_size=2"};
  auto with_out = [&](const std::string& o) {
    auto a = args;
    a.push_back("--out");
    a.push_back((d / o).string());
    return a;
  };
  ProcResult r1 = run(with_out("a"), d), r2 = run(with_out("b"), d);
  ASSERT_EQ(r1.code, 0) << r1.err;
  ASSERT_EQ(r2.code, 0) << r2.err;
  EXPECT_NE(r1.out.find("parallel: 4 rank(s) on the sim backend (trn1.32xlarge): tensor parallel "
                        "2 with sequence parallelism, data parallel 2"),
            std::string::npos)
      << r1.out;
  EXPECT_NE(r1.out.find("modeled on trn1.32xlarge: "), std::string::npos) << r1.out;
  EXPECT_NE(r1.out.find("HBM peak"), std::string::npos) << r1.out;
  EXPECT_EQ(std::count(r1.out.begin(), r1.out.end(), '\n'),
            std::count(r2.out.begin(), r2.out.end(), '\n'));  // one rank prints
  Csv m1 = read_csv(d / "a" / "metrics.csv"), m2 = read_csv(d / "b" / "metrics.csv");
  EXPECT_EQ(m1.header, "step,loss,val_loss,lr,grad_norm,tokens_per_s,epoch,elapsed_s,sim_step_s");
  ASSERT_EQ(m1.rows.size(), 2u);
  ASSERT_EQ(m2.rows.size(), m1.rows.size());
  for (size_t i = 0; i < m1.rows.size(); ++i)
    for (int c : {1, 2, 3, 4, 6, 8})  // all but the host timings
      EXPECT_EQ(m2.rows[i][c], m1.rows[i][c]) << "row " << i << " column " << c;
  EXPECT_NE(m1.rows.back()[8], "");  // the modeled step time
  EXPECT_EQ(slurp(d / "a" / "sample.txt"), slurp(d / "b" / "sample.txt"));
  EXPECT_EQ(slurp(d / "a" / "sample.txt").size(), 7u + 16u);
}

namespace {
std::string output_of(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  return out;
}
}  // namespace

// The README's first command, as a user runs it: nxd-train's default configuration from the root
// of a fresh clone of the repository (shortened to 2 steps) leaves `git status` clean.
TEST(NxdTrainCli, DefaultRunFromTheRepositoryRootLeavesGitStatusClean) {
  const fs::path src = NXD_SOURCE_DIR;
  if (!fs::exists(src / ".git")) GTEST_SKIP() << "not a git checkout";
  if (std::system("git --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no git";
  const fs::path d = temp_dir(), repo = d / "repo";
  const std::string clone = "git clone -q '" + src.string() + "' '" + repo.string() + "'";
  ASSERT_EQ(std::system(clone.c_str()), 0) << clone;
  ASSERT_EQ(output_of("git -C '" + repo.string() + "' status --porcelain"), "");
  const std::string train = "cd '" + repo.string() + "' && '" + NXD_TRAIN_BIN +
                            "' --set trainer.max_steps=2 --set trainer.val_check_interval=1 "
                            "--set trainer.limit_val_batches=1 --set generation.max_new_tokens=4";
  const ProcResult r = nxd::testing::run_process({"/bin/sh", "-c", train}, d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(repo / "runs" / "nxd_train" / "metrics.csv"));
  EXPECT_TRUE(fs::exists(repo / "runs" / "nxd_train" / "tensorboard"));
  EXPECT_EQ(output_of("git -C '" + repo.string() + "' status --porcelain --untracked-files=all"),
            "")
      << "nxd-train's default run left files git sees";
}

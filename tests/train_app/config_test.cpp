#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "nxd/runtime/error.h"
#include "nxd/train_app/config.h"
#include "support/files.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  return nxd::testing::test_temp_dir("nxd_config_test_");
}

fs::path write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
  return p;
}

// The message of the ConfigError that f throws ("" if none).
template <class F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "message: " << msg << "\nexpected: " << part;
}

}  // namespace

TEST(Config, DefaultsResolve) {
  Config c;
  TrainConfig t = resolve(c);
  EXPECT_EQ(t.data.kind, "text");
  EXPECT_EQ(t.data.path, "/usr/share/games/fortunes");
  EXPECT_EQ(t.model.vocab_size, 256);
  EXPECT_EQ(t.grad_accum_steps,
            t.data.global_batch_size / (t.data.micro_batch_size * t.dist.data_parallel_size));
  // the default run is parallel: 8 simulated NeuronCores, TP=2 with SP, DP=4, no accumulation
  EXPECT_EQ(t.dist.backend, "sim");
  EXPECT_EQ(t.dist.instance, "trn1.32xlarge");
  EXPECT_EQ(t.dist.world_size, 8);
  EXPECT_EQ(t.dist.tensor_model_parallel_size, 2);
  EXPECT_TRUE(t.dist.sequence_parallel);
  EXPECT_EQ(t.dist.data_parallel_size, 4);
  EXPECT_EQ(t.grad_accum_steps, 1);
  EXPECT_EQ(t.resolved.get_int("data.micro_batch_size"), 4);
  EXPECT_EQ(t.resolved.get_int("distributed_strategy.kv_replicator"), 1);
  // derived keys are filled in the resolved config
  EXPECT_EQ(t.resolved.get_int("model.num_kv_heads"), t.model.num_attention_heads);
  EXPECT_EQ(t.resolved.get_int("model.max_position_embeddings"), t.data.seq_length);
  EXPECT_EQ(t.resolved.get_int("model.optim.sched.max_steps"), t.trainer.max_steps);
  EXPECT_TRUE(c.is_null("model.num_kv_heads"));  // the input is unchanged
}

TEST(Config, YamlFileNestedAndDotted) {
  auto d = temp_dir();
  auto f = write(d / "c.yaml",
                 "trainer:\n  max_steps: 7\nmodel:\n  hidden_size: 64\n  optim:\n    lr: 3e-4\n"
                 "    betas: [0.8, 0.9]\n    sched: {name: LinearAnnealingWithWarmUp}\n"
                 "data.seq_length: 32\ngeneration:\n  prompt: '42'\nseed: 9\n");
  Config c;
  c.merge_file(f.string());
  EXPECT_EQ(c.get_int("trainer.max_steps"), 7);
  EXPECT_EQ(c.get_int("model.hidden_size"), 64);
  EXPECT_DOUBLE_EQ(c.get_double("model.optim.lr"), 3e-4);
  EXPECT_EQ(c.get_doubles("model.optim.betas"), (std::vector<double>{0.8, 0.9}));
  EXPECT_EQ(c.get_int("data.seq_length"), 32);
  EXPECT_EQ(c.get_string("generation.prompt"), "42");
  TrainConfig t = resolve(c);
  EXPECT_EQ(t.optim.sched_name, "linear");
  EXPECT_EQ(t.seed, 9u);
}

TEST(Config, JsonFile) {
  auto d = temp_dir();
  auto f = write(d / "c.json", R"({"model": {"num_layers": 2, "optim": {"lr": 0.01}}, "seed": 3})");
  Config c;
  c.merge_file(f.string());
  EXPECT_EQ(c.get_int("model.num_layers"), 2);
  EXPECT_DOUBLE_EQ(c.get_double("model.optim.lr"), 0.01);
  // an integer is a valid number
  EXPECT_EQ(c.get_int("seed"), 3);
}

TEST(Config, SetOverridesParseYamlScalars) {
  Config c;
  c.apply_override("model.optim.lr=1e-3");
  c.apply_override("data.shuffle=false");
  c.apply_override("model.optim.betas=[0.9, 0.95]");
  c.apply_override("model.num_kv_heads=null");
  c.apply_override("generation.prompt=123");  // a string key keeps the text
  c.apply_override("trainer.max_steps=1e2");  // an integral float is an integer
  EXPECT_DOUBLE_EQ(c.get_double("model.optim.lr"), 1e-3);
  EXPECT_FALSE(c.get_bool("data.shuffle"));
  EXPECT_EQ(c.get_doubles("model.optim.betas")[1], 0.95);
  EXPECT_TRUE(c.is_null("model.num_kv_heads"));
  EXPECT_EQ(c.get_string("generation.prompt"), "123");
  EXPECT_EQ(c.get_int("trainer.max_steps"), 100);
}

TEST(Config, UnknownKeySuggestsNearest) {
  Config c;
  std::string m = config_error([&] { c.apply_override("model.hiden_size=3"); });
  expect_has(m, "unknown key 'model.hiden_size'");
  expect_has(m, "did you mean 'model.hidden_size'");
  m = config_error([&] { c.apply_override("trainer.seq_length=3"); });
  expect_has(m, "did you mean 'data.seq_length'");
  auto d = temp_dir();
  auto f = write(d / "c.yaml", "model:\n  optim:\n    learning_rate: 0.1\n");
  m = config_error([&] { c.merge_file(f.string()); });
  expect_has(m, "unknown key 'model.optim.learning_rate'");
  expect_has(m, f.string());
  EXPECT_EQ(nearest_key("model.optim.sched.warmup"), "model.optim.sched.warmup_steps");
}

TEST(Config, WrongTypeNamesKeyExpectedAndGot) {
  Config c;
  std::string m = config_error([&] { c.apply_override("model.hidden_size=abc"); });
  expect_has(m, "model.hidden_size: expected an integer, got string \"abc\"");
  m = config_error([&] { c.apply_override("model.hidden_size=2.5"); });
  expect_has(m, "expected an integer, got number 2.5");
  m = config_error([&] { c.apply_override("data.shuffle=3"); });
  expect_has(m, "data.shuffle: expected a boolean");
  m = config_error([&] { c.apply_override("model.optim.betas=[0.9]"); });
  expect_has(m, "model.optim.betas: expected a list of 2 numbers");
  m = config_error([&] { c.apply_override("model.hidden_size=null"); });
  expect_has(m, "expected integer, got null");
  m = config_error([&] { c.merge_json(nlohmann::json::parse(R"({"model": 3})"), "x.json"); });
  expect_has(m, "'model' is a section");
  m = config_error([&] { c.apply_override("nonsense"); });
  expect_has(m, "--set expects dotted.key=value");
}

TEST(Config, YamlSyntaxErrorNamesFileAndLine) {
  auto d = temp_dir();
  auto f = write(d / "bad.yaml", "trainer:\n  max_steps: [1, 2\n");
  std::string m = config_error([&] {
    Config c;
    c.merge_file(f.string());
  });
  expect_has(m, "bad.yaml:");
  expect_has(m, "YAML syntax error");
  EXPECT_THROW(Config().merge_file((d / "missing.yaml").string()), IoError);
}

TEST(Config, ImpossibleSizes) {
  auto err = [](std::vector<std::string> sets) {
    Config c;
    for (auto& s : sets) c.apply_override(s);
    return config_error([&] { resolve(c); });
  };
  expect_has(err({"model.hidden_size=100", "model.num_attention_heads=3"}),
             "model.num_attention_heads=3 does not divide model.hidden_size=100");
  expect_has(err({"model.num_attention_heads=4", "model.num_kv_heads=3"}),
             "model.num_kv_heads=3 does not divide model.num_attention_heads=4");
  expect_has(err({"data.global_batch_size=20", "data.micro_batch_size=8"}),
             "data.global_batch_size=20 is not a multiple of data.micro_batch_size=8");
  expect_has(err({"model.max_position_embeddings=64", "data.seq_length=128"}),
             "data.seq_length=128 exceeds model.max_position_embeddings=64");
  expect_has(err({"trainer.max_steps=-1"}), "trainer.max_steps must be >= 0, got -1");
  // 0 evaluates (--eval): weights must come from somewhere, onto a validation split
  expect_has(err({"trainer.max_steps=0"}),
             "trainer.max_steps=0 (--eval) evaluates existing weights: set model.init_from");
  expect_has(err({"trainer.max_steps=0", "data.val_fraction=0"}),
             "data.val_fraction=0 holds none out");
  expect_has(err({"model.vocab_size=100"}), "too small for byte-level text");
  expect_has(err({"model.optim.sched.min_lr=1"}), "model.optim.sched.min_lr=1");
  expect_has(err({"backend.world_size=6", "distributed_strategy.tensor_model_parallel_size=4"}),
             "world size 6 is not tensor_model_parallel_size 4 x pipeline_model_parallel_size 1");
  expect_has(err({"backend.world_size=4", "distributed_strategy.tensor_model_parallel_size=2",
                  "data.global_batch_size=8", "data.micro_batch_size=8"}),
             "data.global_batch_size=8 is not a multiple of data.micro_batch_size=8 x "
             "data-parallel size=2");
  expect_has(err({"backend.world_size=3", "distributed_strategy.tensor_model_parallel_size=3"}),
             "distributed_strategy.tensor_model_parallel_size=3");
  expect_has(err({"data.path="}), "data.path is empty");
}

TEST(Config, YamlRoundTrip) {
  Config c;
  c.apply_override("model.optim.lr=0.0003");
  c.apply_override("generation.prompt=he said: \"hi\"\\n");
  c.apply_override("model.rope_theta=500000");
  TrainConfig t = resolve(c);
  const std::string y = t.resolved.to_yaml();
  Config back;
  back.merge_json(parse_yaml(y, "config.yaml"), "config.yaml");
  EXPECT_EQ(back.values(), t.resolved.values()) << y;
  EXPECT_NE(y.find("model:\n"), std::string::npos);
  EXPECT_NE(y.find("  optim:\n    name: \"adamw\"\n"), std::string::npos) << y;
}

TEST(Config, DocsMirrorTheRegistry) {
  const std::string md = config_reference_markdown();
  for (const auto& k : config_keys()) EXPECT_NE(md.find("`" + k.key + "`"), std::string::npos);
  std::ifstream in(std::string(NXD_SOURCE_DIR) + "/docs/CONFIG.md");
  ASSERT_TRUE(in) << "docs/CONFIG.md is missing";
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), md) << "docs/CONFIG.md is stale: regenerate it with "
                             "`nxd-train --help-config > docs/CONFIG.md`";
}

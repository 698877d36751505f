// NxD Training's example YAML files as they are (fixtures/nxdt: copies of hf_llama3_8B_config.yaml
// and hf_llama3_8B_SFT_lora_config.yaml): every key nxd implements mapped (interpolations,
// NxD Training's names), the Neuron/XLA keys accepted and listed once, anything else an error
// naming the key and the nearest known one; model.model_config reads a transformers config.json.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>

#include "nxd/train_app/config.h"
#include "support/files.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const fs::path kDir = fs::path(NXD_SOURCE_DIR) / "tests/train_app/fixtures/nxdt";

// The keys another branch (SFT/DPO data) implements: while this build does not know them, the
// test loads a copy without them (the rest of the file unchanged).
const std::vector<std::string> kSftKeys = {
    "data.train_dir", "data.val_dir", "data.dev_choose_samples", "model_alignment_strategy.sft"};

fs::path loadable(const std::string& name, const fs::path& tmp) {
  if (find_key("data.train_dir")) return kDir / name;
  json tree = parse_yaml(nxd::testing::slurp(kDir / name), name);
  for (const std::string& k : kSftKeys) {
    const auto dot = k.rfind('.');
    const std::string section = k.substr(0, dot);
    if (tree.contains(section) && tree[section].is_object()) tree[section].erase(k.substr(dot + 1));
  }
  const fs::path out = tmp / (name + ".json");
  std::ofstream(out) << tree.dump();
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(NxdtYaml, Llama3PretrainingConfigLoadsWithItsKeysMapped) {
  const auto tmp = nxd::testing::test_temp_dir("nxd_nxdt_yaml_");
  Config c;
  c.merge_file(loadable("hf_llama3_8B_config.yaml", tmp).string());
  EXPECT_EQ(c.get_int("seed"), 1234);
  EXPECT_EQ(c.get_int("trainer.max_steps"), 10000);
  EXPECT_TRUE(c.is_null("trainer.max_epochs"));  // -1: no limit
  EXPECT_EQ(c.get_int("trainer.limit_val_batches"), 0);
  EXPECT_EQ(c.get_int("model.optim.sched.max_steps"), 10000);  // ${trainer.max_steps}
  EXPECT_EQ(c.get_int("data.seq_length"), 8192);               // model.encoder_seq_length
  EXPECT_EQ(c.get_string("exp_manager.exp_dir"), find_key("exp_manager.exp_dir")->default_value);
  EXPECT_EQ(c.get_int("distributed_strategy.tensor_model_parallel_size"), 32);
  EXPECT_EQ(c.get_int("distributed_strategy.kv_replicator"), 4);
  EXPECT_TRUE(c.get_bool("distributed_strategy.zero1"));
  EXPECT_EQ(c.get_string("precision.type"), "mixed_precision");
  EXPECT_TRUE(c.is_null("precision.master_weights"));  // derived from the type, as NxDT does
  EXPECT_EQ(c.get_string("model.optim.sched.name"), "LinearAnnealingWithWarmUp");
  EXPECT_EQ(c.get_doubles("model.optim.betas"), (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(c.get_string("model.model_config"), "/home/ubuntu/config.json");
  EXPECT_EQ(c.get_string("model.activations_checkpoint_granularity"), "selective");
  const std::vector<std::string> want = {
      "name",
      "compiler_cache_url",
      "compiler_flags",
      "aync_exec_max_inflight_requests",
      "bucket_size_collectives",
      "exp_manager.checkpoint_callback_params.filename",
      "exp_manager.checkpoint_callback_params.model_parallel_size",
      "exp_manager.enable_recovery_time_instrumentation",
      "exp_manager.explicit_log_dir",
      "exp_manager.load_xser",
      "exp_manager.log_gradient_norm",
      "exp_manager.log_local_rank_0_only",
      "exp_manager.log_parameter_norm",
      "exp_manager.name",
      "exp_manager.save_xser",
      "model.fuse_qkv",
      "model.fusions.flash_attention",
      "model.fusions.softmax",
      "model.optim.capturable",
      "model.qkv_linear",
      "model.use_cpu_initialization",
      "neuron_experimental_compress_rg",
      "neuron_rt_exec_timeout",
      "precision.neuron_rt_stochastic_rounding_en",
      "precision.xla_downcast_bf16",
      "precision.xla_use_bf16",
      "trainer.devices",
      "trainer.num_nodes",
      "precision.fp32_grad_acc",
      "precision.master_weights"};
  std::vector<std::string> got = c.not_applicable(), w = want;
  std::sort(got.begin(), got.end());
  std::sort(w.begin(), w.end());
  EXPECT_EQ(got, w);
  // merging the file again lists each key once
  c.merge_file(loadable("hf_llama3_8B_config.yaml", tmp).string());
  EXPECT_EQ(c.not_applicable().size(), want.size());
}

TEST(NxdtYaml, SftLoraConfigLoadsAndResolvesWithItsArchitectureFromConfigJson) {
  const auto tmp = nxd::testing::test_temp_dir("nxd_nxdt_lora_");
  Config c;
  c.merge_file(loadable("hf_llama3_8B_SFT_lora_config.yaml", tmp).string());
  EXPECT_EQ(c.get_int("data.seq_length"), 4096);  // the file's own, not encoder_seq_length
  EXPECT_EQ(c.get_string("data.tokenizer"), "/home/ubuntu/llama3_tokenizer");
  // weight_init_only: the pretrained checkpoint's weights, a fresh optimizer
  EXPECT_EQ(c.get_string("model.init_from"), "/home/ubuntu/pretrained_ckpt/");
  EXPECT_TRUE(c.is_null("exp_manager.resume_from_checkpoint"));
  EXPECT_EQ(c.get_int("model_alignment_strategy.peft.lora_rank"), 16);
  EXPECT_EQ(c.get_string("precision.type"), "autocast");
  for (const char* k :
       {"model_alignment_strategy.peft.lora_verbose",
        "model_alignment_strategy.peft.save_lora_base", "exp_manager.ckpt_ptl_version"})
    EXPECT_NE(std::find(c.not_applicable().begin(), c.not_applicable().end(), k),
              c.not_applicable().end())
        << k;
  // resolved with the machine's paths and sizes replaced: the architecture comes from a Qwen3
  // config.json (model_config), the file's num_layers / hidden_size / rope_theta win
  std::ofstream(tmp / "config.json") << json{{"model_type", "qwen3"},
                                             {"vocab_size", 64},
                                             {"hidden_size", 32},
                                             {"intermediate_size", 48},
                                             {"num_hidden_layers", 2},
                                             {"num_attention_heads", 4},
                                             {"num_key_value_heads", 2},
                                             {"head_dim", 16},
                                             {"max_position_embeddings", 64},
                                             {"rms_norm_eps", 1e-6},
                                             {"sliding_window", nullptr}}
                                            .dump();
  for (const std::string& s : std::vector<std::string>{
           "model.init_from=null", "data.tokenizer=null", "data.kind=random",
           "model.model_config=" + (tmp / "config.json").string(), "model.num_layers=2",
           "model.hidden_size=32", "model.max_position_embeddings=64", "data.seq_length=16",
           "data.global_batch_size=4", "distributed_strategy.tensor_model_parallel_size=2",
           "distributed_strategy.kv_replicator=1", "backend.world_size=4",
           "exp_manager.exp_dir=" + (tmp / "out").string()})
    c.apply_override(s);
  const TrainConfig t = resolve(c);
  const ModelConfig m = model_config(t);
  EXPECT_EQ(m.arch, "qwen3");
  EXPECT_TRUE(m.qk_norm);
  EXPECT_EQ(m.head_dim(), 16);
  EXPECT_EQ(m.num_kv_heads, 2);
  EXPECT_EQ(m.vocab_size, 64);
  EXPECT_EQ(m.rope_theta, 500000.0);  // the file's, over config.json's default
  EXPECT_EQ(m.norm_eps, 1e-6);
  EXPECT_EQ(m.name_or_path, (tmp / "config.json").string());  // NxDModel::name_or_path()
  ASSERT_TRUE(t.lora.has_value());
  EXPECT_EQ(t.dist.data_parallel_size, 2);
  // a Mistral's sliding window has no ring attention: context parallelism is refused by name
  std::ofstream(tmp / "config.json")
      << json{{"model_type", "mistral"},  {"vocab_size", 64},
              {"hidden_size", 32},        {"intermediate_size", 48},
              {"num_hidden_layers", 2},   {"num_attention_heads", 4},
              {"num_key_value_heads", 2}, {"max_position_embeddings", 64},
              {"rms_norm_eps", 1e-6},     {"sliding_window", 8}}
             .dump();
  c.apply_override("distributed_strategy.context_parallel_size=2");
  c.apply_override("model_alignment_strategy.sft.packing=false");  // packing has no CP either
  const std::string err = error_of([&] { resolve(c); });
  EXPECT_NE(err.find("sliding_window=8"), std::string::npos) << err;
}

TEST(NxdtYaml, WhatNxdWouldRunDifferentlyIsAnErrorNamingTheKey) {
  const auto tmp = nxd::testing::test_temp_dir("nxd_nxdt_errors_");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"trainer:\n  max_stepz: 5\n", "unknown key 'trainer.max_stepz'"},
      {"trainer:\n  max_stepz: 5\n", "did you mean 'trainer.max_steps'"},
      {"model:\n  fusion:\n    softmax: True\n", "unknown key 'model.fusion"},
      {"trainer:\n  num_sanity_val_steps: 2\n", "trainer.num_sanity_val_steps=2"},
      {"model:\n  activations_checkpoint_recompute: [MLP]\n", "activations_checkpoint_recompute"},
      {"model_alignment_strategy:\n  peft:\n    lora_bias: all\n", "lora_bias=\"all\""},
      {"model:\n  optim:\n    sched:\n      max_steps: ${trainer.max_stepz}\n",
       "'${trainer.max_stepz}' names no key of the file"},
      {"trainer:\n  max_steps: ${oc.env:STEPS}\n", "resolver '${oc.env:STEPS}'"},
      {"precision:\n  type: manual\n", "precision.type"},
  };
  for (const auto& [yaml, want] : cases) {
    SCOPED_TRACE(yaml);
    std::ofstream(tmp / "c.yaml") << yaml;
    Config c;
    const std::string e = error_of([&] { c.merge_file((tmp / "c.yaml").string()); });
    EXPECT_NE(e.find(want), std::string::npos) << e;
  }
  // interpolations: a key of the file, nested, inside text, and NxD Training's multiply
  std::ofstream(tmp / "ok.yaml")
      << "trainer: {max_steps: 40}\n"
         "distributed_strategy: {tensor_model_parallel_size: 2, pipeline_model_parallel_size: 3}\n"
         "model: {optim: {sched: {max_steps: '${trainer.max_steps}', warmup_steps: "
         "'${multiply:${distributed_strategy.tensor_model_parallel_size}, 5}'}}}\n"
         "generation: {prompt: 'steps ${trainer.max_steps}!'}\n";
  Config c;
  c.merge_file((tmp / "ok.yaml").string());
  EXPECT_EQ(c.get_int("model.optim.sched.max_steps"), 40);
  EXPECT_EQ(c.get_int("model.optim.sched.warmup_steps"), 10);
  EXPECT_EQ(c.get_string("generation.prompt"), "steps 40!");
}

// model.arch alone (no config.json, no init_from): the family's fixed parts as transformers builds
// them (Qwen2's q/k/v biases, Qwen3's q/k norms, Mistral's window of 4096 when it matters).
TEST(NxdtYaml, FamiliesFromTheirArchAloneTakeTransformersFixedParts) {
  const auto tmp = nxd::testing::test_temp_dir("nxd_nxdt_arch_");
  for (const std::string arch : {"qwen2", "qwen3", "mistral"}) {
    SCOPED_TRACE(arch);
    Config c;
    for (const std::string& s : std::vector<std::string>{
             "model.arch=" + arch, "data.kind=random", "backend.world_size=1",
             "distributed_strategy.tensor_model_parallel_size=1", "data.seq_length=16",
             "model.max_position_embeddings=8192", "exp_manager.exp_dir=" + tmp.string()})
      c.apply_override(s);
    const ModelConfig m = model_config(resolve(c));
    EXPECT_EQ(m.qkv_bias, arch == "qwen2");
    EXPECT_EQ(m.qk_norm, arch == "qwen3");
    EXPECT_EQ(m.sliding_window, arch == "mistral" ? 4096 : 0);
  }
}

TEST(NxdtYaml, OrpoConfigLoadsAndResolvesToOrpo) {
  // an ORPO configuration in NxD Training's layout (model_alignment_strategy.orpo): its keys
  // load as written and resolve to ORPO with the file's beta, prompt length and truncation
  const auto tmp = nxd::testing::test_temp_dir("nxd_nxdt_orpo_");
  Config c;
  c.merge_file((kDir / "hf_llama3_8B_ORPO_config.yaml").string());
  EXPECT_EQ(c.get_double("model_alignment_strategy.orpo.beta"), 0.1);
  EXPECT_EQ(c.get_int("model_alignment_strategy.orpo.max_prompt_length"), 2048);
  EXPECT_EQ(c.get_string("model_alignment_strategy.orpo.truncation_mode"), "keep_start");
  EXPECT_EQ(c.get_int("data.seq_length"), 4096);
  for (const std::string& s : std::vector<std::string>{
           "model.init_from=null", "data.tokenizer=null", "model.model_config=null",
           "model.num_layers=2", "model.hidden_size=32", "model.num_attention_heads=4",
           "model.max_position_embeddings=4096", "data.global_batch_size=4",
           "distributed_strategy.tensor_model_parallel_size=2",
           "distributed_strategy.kv_replicator=1", "backend.world_size=4",
           "exp_manager.exp_dir=" + (tmp / "out").string()})
    c.apply_override(s);
  const TrainConfig t = resolve(c);
  EXPECT_EQ(t.alignment.kind, AlignmentSection::Kind::orpo);
  EXPECT_EQ(t.alignment.orpo_beta, 0.1);
  EXPECT_EQ(t.alignment.max_prompt_length, 2048);
  EXPECT_EQ(t.alignment.truncation_mode, "keep_start");
  EXPECT_EQ(t.alignment.train_dir, "/home/ubuntu/training.jsonl");
}

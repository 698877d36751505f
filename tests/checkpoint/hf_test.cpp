// transformers folders against a plain-PyTorch reference (hf_reference.py, run once with Debian's
// python3-torch; skipped with a message when it is not installed): every config variant nxd
// reads, every architecture (llama, qwen2, qwen3, mistral, gpt_neox), F32/BF16/F16 and sharded
// files, inv_freq buffers and a tied config's
// head copy; import-hf at TP 2 -> the checkpoint as a weight source (what model.init_from loads)
// -> the model's logits within 1e-5 of PyTorch's on fixed tokens; import -> export -> import is
// the identity; what nxd cannot express is refused by name.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt_util.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/offline.h"
#include "support/tiny_models.h"

namespace nxd::testing {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

const char* kPython = "/usr/bin/python3";

json base_llama() {
  return {{"model_type", "llama"},
          {"architectures", {"LlamaForCausalLM"}},
          {"vocab_size", 64},
          {"hidden_size", 32},
          {"intermediate_size", 48},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 500.0},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", false}};
}

json base_neox() {
  return {{"model_type", "gpt_neox"}, {"architectures", {"GPTNeoXForCausalLM"}},
          {"vocab_size", 64},         {"hidden_size", 32},
          {"intermediate_size", 64},  {"num_hidden_layers", 2},
          {"num_attention_heads", 4}, {"max_position_embeddings", 64},
          {"layer_norm_eps", 1e-5},   {"rotary_pct", 0.25},
          {"rotary_emb_base", 10000}, {"use_parallel_residual", true},
          {"hidden_act", "gelu"},     {"tie_word_embeddings", false}};
}

json with(json j, const json& patch) {
  j.merge_patch(patch);
  return j;
}

// name -> (config, file options)
std::vector<std::tuple<std::string, json, json>> variants() {
  return {
      {"llama_gqa", base_llama(), json::object()},
      {"llama_tied_bf16_inv_freq_head_copy",
       with(base_llama(), {{"tie_word_embeddings", true}, {"torch_dtype", "bfloat16"}}),
       {{"dtype", "BF16"}, {"inv_freq", true}, {"head_copy", true}}},
      {"llama_head_dim_f16_sharded",
       with(base_llama(), {{"head_dim", 16}}),
       {{"dtype", "F16"}, {"shards", 3}}},
      {"llama_rope_linear_gelu_tanh",
       with(base_llama(), {{"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}},
                           {"hidden_act", "gelu_pytorch_tanh"}}),
       json::object()},
      // llama3 with wavelengths on every side of the bands (head_dim 8, theta 500: 6, 30, 140,
      // 660 against 64 / 4 and 64 / 1)
      {"llama_rope_llama3",
       with(base_llama(), {{"rope_scaling",
                            {{"rope_type", "llama3"},
                             {"factor", 8.0},
                             {"low_freq_factor", 1.0},
                             {"high_freq_factor", 4.0},
                             {"original_max_position_embeddings", 64}}}}),
       json::object()},
      {"llama_biases_gelu",
       with(base_llama(), {{"attention_bias", true}, {"mlp_bias", true}, {"hidden_act", "gelu"}}),
       json::object()},
      // Qwen2: q/k/v biases (tied, as Qwen2.5's small models); one with a sliding window on every
      // layer (use_sliding_window, max_window_layers 0) shorter than the 24 reference tokens
      {"qwen2_tied", with(base_llama(), {{"model_type", "qwen2"}, {"tie_word_embeddings", true}}),
       json::object()},
      {"qwen2_sliding_window",
       with(base_llama(), {{"model_type", "qwen2"},
                           {"use_sliding_window", true},
                           {"sliding_window", 5},
                           {"max_window_layers", 0}}),
       {{"dtype", "BF16"}}},
      // Qwen3: q_norm/k_norm, head_dim its own key (16 with hidden 32 and 4 heads), and
      // Qwen3Config's default head_dim 128 with attention_bias on q/k/v/o
      {"qwen3_head_dim", with(base_llama(), {{"model_type", "qwen3"}, {"head_dim", 16}}),
       json::object()},
      {"qwen3_default_head_dim_bias",
       with(base_llama(), {{"model_type", "qwen3"}, {"attention_bias", true}}), json::object()},
      // Mistral: a sliding window of 5 over 24 tokens; and sliding_window null (full causal)
      {"mistral_sliding_window",
       with(base_llama(),
            {{"model_type", "mistral"}, {"sliding_window", 5}, {"head_dim", nullptr}}),
       json::object()},
      {"mistral_no_window_sharded",
       with(base_llama(), {{"model_type", "mistral"}, {"sliding_window", nullptr}}),
       {{"shards", 2}}},
      {"neox_parallel_gelu", base_neox(), json::object()},
      {"neox_sequential_gelu_new_tied_bf16",
       with(base_neox(), {{"use_parallel_residual", false},
                          {"hidden_act", "gelu_new"},
                          {"rotary_pct", 0.5},
                          {"rotary_emb_base", 500},
                          {"tie_word_embeddings", true}}),
       {{"dtype", "BF16"}, {"inv_freq", true}, {"head_copy", true}, {"shards", 2}}},
  };
}

// The reference folders, made once per test binary run (about 4 s: importing torch).
class HfReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("nxd_hf_ref_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    if (std::system((std::string(kPython) + " -c 'import torch' >/dev/null 2>&1").c_str()) != 0)
      return;
    json spec = json::array();
    for (const auto& [name, cfg, opt] : variants())
      spec.push_back({{"out", (*dir_ / name).string()}, {"config", cfg}, {"options", opt}});
    std::ofstream(*dir_ / "spec.json") << spec.dump();
    const std::string cmd =
        std::string(kPython) + " " NXD_HF_REFERENCE " " + (*dir_ / "spec.json").string();
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    have_torch_ = true;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  void SetUp() override {
    if (!have_torch_)
      GTEST_SKIP() << "python3-torch is not installed (" << kPython
                   << " -c 'import torch' failed): no PyTorch reference";
  }
  static fs::path* dir_;
  static bool have_torch_;
};
fs::path* HfReference::dir_ = nullptr;
bool HfReference::have_torch_ = false;

std::vector<float> read_floats(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  in.seekg(0, std::ios::end);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

// The logits of the model a weight source describes, at TP 1, on the reference's tokens.
Tensor logits_of(const ckpt::WeightSource& src, const std::vector<int64_t>& ids) {
  auto model = make_causal_lm(src.config, 7);
  std::set<std::string> used;
  const auto full = ckpt::read_source_weights(src);
  ckpt::load_full_tensors({model.get()}, full, src.description, {.used = &used});
  EXPECT_EQ(used.size(), full.size());
  NoGradGuard g;
  model->eval();
  Tensor out = model->forward(from_vector<int64_t>(ids, {1, static_cast<int64_t>(ids.size())}));
  return out.reshape({static_cast<int64_t>(ids.size()), src.config.vocab_size}).contiguous();
}

TEST_F(HfReference, ImportThenInitFromMatchesPyTorchLogits) {
  for (const auto& [name, cfg, opt] : variants()) {
    SCOPED_TRACE(name);
    const fs::path hf = *dir_ / name;
    ScratchDir tmp("nxd_hf_" + name + "_");
    // import-hf at TP 2 (resharded), then the checkpoint as model.init_from reads it
    ckpt::import_hf(hf, tmp.path / "ckpt", "imported", 2, 1);
    const ckpt::WeightSource src = ckpt::inspect_weight_source(tmp.path / "ckpt" / "imported");
    ASSERT_EQ(src.kind, ckpt::WeightSource::Kind::checkpoint);
    const auto ids = json::parse(slurp(hf / "tokens.json")).get<std::vector<int64_t>>();
    const Tensor got = logits_of(src, ids);
    const std::vector<float> want = read_floats(hf / "logits.bin");
    ASSERT_EQ(static_cast<size_t>(got.numel()), want.size());
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(got.data<float>()[i]) - want[i]));
    EXPECT_LT(worst, 1e-5) << "largest |logit difference| " << worst;
    std::printf("    [%s] largest |logit - PyTorch's| %.3g\n", name.c_str(), worst);
    // the folder itself as the source gives the same logits, bitwise
    const Tensor direct = logits_of(ckpt::inspect_weight_source(hf), ids);
    EXPECT_BITWISE_EQ(direct, got);
  }
}

TEST_F(HfReference, ImportExportImportIsTheIdentity) {
  for (const auto& [name, cfg, opt] : variants()) {
    SCOPED_TRACE(name);
    ScratchDir tmp("nxd_hf_rt_" + name + "_");
    ckpt::import_hf(*dir_ / name, tmp.path / "a", "imported", 1, 1);
    ckpt::export_hf(tmp.path / "a" / "imported", tmp.path / "hf");
    ckpt::import_hf(tmp.path / "hf", tmp.path / "b", "imported", 2, 1);
    const ModelConfig c0 = ckpt::read_hf_config(*dir_ / name);
    const ModelConfig c1 = ckpt::read_hf_config(tmp.path / "hf");
    EXPECT_EQ(ckpt::model_config_json(c0).dump(), ckpt::model_config_json(c1).dump());
    const auto a = ckpt::read_merged_model(tmp.path / "a" / "imported");
    const auto b = ckpt::read_merged_model(tmp.path / "b" / "imported");
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_BITWISE_EQ(a[i].second, b[i].second);
    }
  }
}

// ---- without PyTorch ----

void write_config(const fs::path& dir, const json& cfg) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << cfg.dump();
}

TEST(HfConfig, UnsupportedKeysAreRefusedByName) {
  ScratchDir tmp("nxd_hf_refuse_");
  const std::vector<std::pair<json, std::string>> cases = {
      {with(base_llama(), {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}}),
       "rope_scaling of type 'yarn'"},
      {with(base_neox(), {{"rope_scaling", {{"rope_type", "longrope"}}}}),
       "rope_scaling of type 'longrope'"},
      {with(base_llama(), {{"rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}}}),
       "rope_scaling of type 'dynamic'"},
      {with(base_llama(), {{"hidden_act", "relu"}}), "hidden_act 'relu'"},
      {with(base_neox(), {{"hidden_act", "relu"}}), "hidden_act 'relu'"},
      {with(base_neox(), {{"attention_bias", false}}), "attention_bias: false"},
      {with(base_llama(), {{"model_type", "phi3"}}), "model_type 'phi3'"},
      {with(base_llama(), {{"model_type", "qwen2"},
                           {"use_sliding_window", true},
                           {"sliding_window", 8},
                           {"max_window_layers", 1}}),
       "a sliding window on 1 of 2 layers"},
      {with(base_llama(), {{"model_type", "qwen3"},
                           {"layer_types", {"full_attention", "sliding_attention"}},
                           {"sliding_window", 8}}),
       "a sliding window on 1 of 2 layers"},
      {with(base_llama(), {{"model_type", "mistral"}, {"attention_dropout", 0.1}}),
       "attention_dropout 0.1"},
      {with(base_llama(), {{"model_type", "qwen2"}, {"rope_scaling", {{"rope_type", "yarn"}}}}),
       "rope_scaling of type 'yarn'"},
  };
  for (const auto& [cfg, want] : cases) {
    SCOPED_TRACE(cfg.dump());
    write_config(tmp.path, cfg);
    const std::string e = error_of([&] { ckpt::read_hf_config(tmp.path); });
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_NE(e.find((tmp.path / "config.json").string()), std::string::npos) << e;
  }
}

// Integer fields are range-checked before they divide or size anything (issue 34: heads 0 with a
// head_dim was a SIGFPE; 64.5 was truncated; kv heads 0 accepted), and long values are shortened.
TEST(HfConfig, SizesAreRangeCheckedBeforeUse) {
  ScratchDir tmp("nxd_hf_range_");
  const std::vector<std::pair<json, std::string>> cases = {
      {with(base_llama(), {{"num_attention_heads", 0}, {"head_dim", 8}}),
       "'num_attention_heads' = 0 is outside"},
      {with(base_llama(), {{"hidden_size", 64.5}}), "'hidden_size' is 64.5, not an integer"},
      {with(base_llama(), {{"num_key_value_heads", 0}}), "'num_key_value_heads' = 0 is outside"},
      {with(base_llama(), {{"vocab_size", -3}}), "'vocab_size' = -3 is outside"},
      {with(base_llama(), {{"num_hidden_layers", "4"}}), "'num_hidden_layers' is \"4\""},
      {with(base_llama(), {{"model_type", std::string(150000, 'x')}}), "(150000 characters)"},
  };
  for (const auto& [cfg, want] : cases) {
    SCOPED_TRACE(cfg.dump().substr(0, 200));
    write_config(tmp.path, cfg);
    const std::string e = error_of([&] { ckpt::read_hf_config(tmp.path); });
    EXPECT_NE(e.find(want), std::string::npos) << e.substr(0, 300);
    EXPECT_LT(e.size(), 400u) << "values are shortened in messages";
  }
}

TEST(HfConfig, ExportWritesEveryKeyBack) {
  ModelConfig c;
  c.arch = "gpt_neox";
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.rotary_pct = 0.5;
  c.rope_theta = 500;
  c.norm_eps = 1e-6;
  c.gelu_tanh = true;
  c.use_parallel_residual = false;
  c.tie_word_embeddings = true;
  const ModelConfig back = ckpt::model_config_from_hf(ckpt::hf_config_json(c));
  EXPECT_EQ(back.rotary_pct, 0.5);
  EXPECT_EQ(back.rope_theta, 500);
  EXPECT_EQ(back.norm_eps, 1e-6);
  EXPECT_TRUE(back.gelu_tanh);
  EXPECT_FALSE(back.use_parallel_residual);
  EXPECT_TRUE(back.tie_word_embeddings);
  ModelConfig l;
  l.vocab_size = 64;
  l.hidden_size = 32;
  l.num_attention_heads = 4;
  l.num_kv_heads = 2;
  l.attention_head_dim = 16;
  const json j = ckpt::hf_config_json(l);
  EXPECT_EQ(j["head_dim"], 16);
  EXPECT_EQ(ckpt::model_config_from_hf(j).head_dim(), 16);
}

// The llama-family variants write their own model_type and keys, read back to the same config,
// and what a family cannot express is refused by name.
TEST(HfConfig, FamiliesRoundTripAndRefuseWhatTheyCannotExpress) {
  ModelConfig q2 = nxd::testing::tiny_model("llama");  // 2 KV heads, FFN 48, 32 positions
  q2.arch = "qwen2";
  q2.qkv_bias = true;
  q2.sliding_window = 16;
  ModelConfig q3 = q2;
  q3.arch = "qwen3";
  q3.qkv_bias = false;
  q3.qk_norm = true;
  q3.attention_head_dim = 16;
  q3.sliding_window = 0;
  ModelConfig mi = q3;
  mi.arch = "mistral";
  mi.qk_norm = false;
  mi.sliding_window = 8;
  for (const ModelConfig& c : {q2, q3, mi}) {
    SCOPED_TRACE(c.arch);
    const json j = ckpt::hf_config_json(c);
    EXPECT_EQ(j["model_type"], c.arch);
    EXPECT_EQ(ckpt::model_config_json(ckpt::model_config_from_hf(j)).dump(),
              ckpt::model_config_json(c).dump());
  }
  ModelConfig bad = q2;
  bad.qk_norm = true;
  EXPECT_NE(error_of([&] { ckpt::hf_config_json(bad); }).find("qwen2 with"), std::string::npos);
  bad = q3;
  bad.qkv_bias = true;
  EXPECT_NE(error_of([&] { ckpt::hf_config_json(bad); }).find("qkv_bias=1"), std::string::npos);
  bad = mi;
  bad.attention_bias = true;
  EXPECT_NE(error_of([&] { ckpt::hf_config_json(bad); }).find("mistral with"), std::string::npos);
  ModelConfig ll = q2;
  ll.arch = "llama";
  EXPECT_NE(error_of([&] { ckpt::hf_config_json(ll); }).find("sliding_window=16"),
            std::string::npos);
}

TEST(HfFiles, MissingShardAndUnknownDtypeAreNamed) {
  ScratchDir tmp("nxd_hf_files_");
  write_config(tmp.path, base_llama());
  std::ofstream(tmp.path / "model.safetensors.index.json")
      << json{{"weight_map", {{"model.norm.weight", "model-00001-of-00002.safetensors"}}}}.dump();
  const ModelConfig c = ckpt::read_hf_config(tmp.path);
  std::string e = error_of([&] { ckpt::read_hf_weights(tmp.path, c); });
  EXPECT_NE(e.find("model-00001-of-00002.safetensors"), std::string::npos) << e;
  // an I64 tensor: named with its dtype
  fs::remove(tmp.path / "model.safetensors.index.json");
  std::string head =
      json{{"model.norm.weight", {{"dtype", "I64"}, {"shape", {1}}, {"data_offsets", {0, 8}}}}}
          .dump();
  head.resize((head.size() + 7) / 8 * 8, ' ');
  std::ofstream f(tmp.path / "model.safetensors", std::ios::binary);
  const uint64_t n = head.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << head << std::string(8, '\0');
  f.close();
  e = error_of([&] { ckpt::read_hf_weights(tmp.path, c); });
  EXPECT_NE(e.find("'model.norm.weight' is I64"), std::string::npos) << e;
}

TEST(WeightSource, SaysWhatAPathIsNot) {
  ScratchDir tmp("nxd_hf_source_");
  const std::string e = error_of([&] { ckpt::inspect_weight_source(tmp.path); });
  EXPECT_NE(e.find("is neither a transformers folder"), std::string::npos) << e;
  const std::string e2 = error_of([&] { ckpt::inspect_weight_source(tmp.path / "nope"); });
  EXPECT_NE(e2.find("does not exist"), std::string::npos) << e2;
}

}  // namespace
}  // namespace nxd::testing

// Offline tools' library side: export gives the full tensors (bitwise those of a TP=1 load),
// offline resharding preserves every tensor, verify names the first bad tensor, and the model
// config recorded in metadata.json round-trips.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "ckpt_util.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/io/safetensors.h"
#include "support/files.h"
#include "support/ranks.h"
#include "zero1_util.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
using nxd::testing::run_ranks;
using nxd::testing::Trainee;

std::map<std::string, Tensor> read_map(const fs::path& p) {
  std::map<std::string, Tensor> m;
  for (auto& [n, t] : io::SafetensorsReader(p).read_all()) m[n] = t;
  return m;
}

TEST(Offline, ExportAndReshardKeepEveryTensor) {
  const nxd::testing::ScratchDir root_scratch("nxd_offline_");
  const fs::path& root = root_scratch.path;
  run_ranks(2, [&] {
    parallel_state::initialize_model_parallel(2);
    Trainee t(2);
    t.step(0);
    save_checkpoint(root / "tp2", "step_1", t.model.get(), t.opt.get(), t.sched.get(),
                    nlohmann::json{{"k", 1}});
  });
  const fs::path tag = resolve_checkpoint(root / "tp2");
  EXPECT_EQ(tag, root / "tp2" / "step_1");
  export_merged(tag, root / "merged.safetensors");
  const auto merged = read_map(root / "merged.safetensors");
  Trainee one(1, 9);
  load_checkpoint(root / "tp2", one.model.get(), nullptr, nullptr);
  ASSERT_EQ(merged.size(), one.model->state_dict().size());
  for (const auto& [n, t] : one.model->state_dict())
    EXPECT_TRUE(nxd::testing::bitwise_equal(merged.at(n), t.detach(), n));
  EXPECT_EQ(io::SafetensorsReader(root / "merged.safetensors")
                .header()
                .metadata.count("nxd.model_config"),
            1u);

  // TP 2 -> 4 (K/V now replicated) -> 1, offline: the exported tensors never change
  reshard_checkpoint(tag, root / "tp4", {.tp = 4});
  reshard_checkpoint(root / "tp4" / "step_1", root / "tp1", {.tp = 1, .dp = 2});
  reshard_checkpoint(root / "tp4" / "step_1", root / "tp2pp2", {.tp = 2, .pp = 2});  // stages
  for (const char* d : {"tp4", "tp1", "tp2pp2"}) {
    const fs::path t = resolve_checkpoint(root / d);
    EXPECT_EQ(read_metadata(t)["step"], 1);
    EXPECT_GT(verify_checkpoint(t).tensors, 0);
    export_merged(t, root / (std::string(d) + ".safetensors"));
    const auto m = read_map(root / (std::string(d) + ".safetensors"));
    ASSERT_EQ(m.size(), merged.size()) << d;
    for (const auto& [n, x] : merged) EXPECT_TRUE(nxd::testing::bitwise_equal(m.at(n), x, n));
  }
  EXPECT_EQ(read_metadata(root / "tp4/step_1")["parallel"]["tp"], 4);
  EXPECT_EQ(read_metadata(root / "tp1/step_1")["parallel"]["dp"], 2);
  // the optimizer state, scheduler and user content came along
  Trainee back(1, 9);
  const auto user =
      load_checkpoint(root / "tp1", back.model.get(), back.opt.get(), back.sched.get());
  EXPECT_EQ(user.at("k"), 1);
  Trainee direct(1, 9);
  load_checkpoint(root / "tp2", direct.model.get(), direct.opt.get(), direct.sched.get());
  nxd::testing::expect_same(nxd::testing::snapshot(*back.model, back.opt.get()),
                            nxd::testing::snapshot(*direct.model, direct.opt.get()), "TP2->4->1");
  EXPECT_EQ(read_metadata(root / "tp2pp2/step_1")["parallel"]["pp"], 2);
  Trainee staged(1, 9);
  load_checkpoint(root / "tp2pp2", staged.model.get(), staged.opt.get(), staged.sched.get());
  nxd::testing::expect_same(nxd::testing::snapshot(*staged.model, staged.opt.get()),
                            nxd::testing::snapshot(*direct.model, direct.opt.get()),
                            "TP2->4->TP2xPP2->1");
}

// export then import (at TP 4, K/V replicated) gives bitwise the same parameters.
TEST(Offline, ExportThenImportIsBitwise) {
  const nxd::testing::ScratchDir root_scratch("nxd_offline_");
  const fs::path& root = root_scratch.path;
  Trainee t(1);
  t.step(0);
  save_checkpoint(root / "src", "a", t.model.get(), nullptr, nullptr);
  export_merged(root / "src/a", root / "m.safetensors");
  import_merged(root / "m.safetensors", root / "tp4", "b", 4, 1);
  EXPECT_EQ(read_metadata(root / "tp4/b")["parallel"]["tp"], 4);
  Trainee back(1, 9);
  load_checkpoint(root / "tp4", back.model.get(), nullptr, nullptr);
  for (const auto& [n, x] : t.model->state_dict())
    EXPECT_TRUE(nxd::testing::bitwise_equal(back.model->state_dict().at(n), x.detach(), n));
  // a file without the model config, and one with a tensor missing
  io::write_safetensors(root / "bare.safetensors", {{"x", zeros({2})}});
  EXPECT_THROW(import_merged(root / "bare.safetensors", root / "o", "c", 1, 1), CheckpointError);
  auto all = io::SafetensorsReader(root / "m.safetensors").read_all();
  const auto md = io::SafetensorsReader(root / "m.safetensors").header().metadata;
  all.pop_back();
  io::write_safetensors(root / "short.safetensors", all, md);
  try {
    import_merged(root / "short.safetensors", root / "o", "c", 2, 1);
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("has no tensor"), std::string::npos) << e.what();
  }
}

// The safetensors format checked from its specification alone (github.com/huggingface/safetensors,
// README "Format"), not with nxd's reader: 8 bytes of little-endian u64 N, N bytes of a UTF-8
// JSON object (trailing spaces allowed) mapping each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end]} (offsets relative to the byte after the header) plus an optional
// "__metadata__" of string to string; each tensor's bytes = product of the shape x the dtype's
// size, and the tensors cover the data region (the rest of the file) exactly, without overlaps.
// Returns the tensor names, or fails the test naming the rule.
std::vector<std::string> check_safetensors_spec(const fs::path& p) {
  const std::string b = nxd::testing::slurp(p);
  EXPECT_GE(b.size(), 8u) << p;
  if (b.size() < 8) return {};
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(b[static_cast<size_t>(i)]);
  EXPECT_LE(8 + n, b.size()) << "header length " << n;
  if (8 + n > b.size()) return {};
  const std::string text = b.substr(8, n);
  EXPECT_EQ(text.front(), '{');
  EXPECT_EQ(text.find_last_not_of(' '), text.rfind('}')) << "only spaces may pad the header";
  const nlohmann::json h = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(h.is_object()) << "the header is not a JSON object";
  if (!h.is_object()) return {};
  const std::map<std::string, int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  std::vector<std::pair<int64_t, int64_t>> spans;
  std::vector<std::string> names;
  for (const auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      EXPECT_TRUE(v.is_object());
      for (const auto& [k, x] : v.items()) EXPECT_TRUE(x.is_string()) << "__metadata__ " << k;
      continue;
    }
    names.push_back(name);
    EXPECT_TRUE(v.is_object() && v.size() == 3 && v.contains("dtype") && v.contains("shape") &&
                v.contains("data_offsets"))
        << name << ": " << v.dump();
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets"))
      continue;
    const auto dt = sizes.find(v["dtype"].is_string() ? v["dtype"].get<std::string>() : "");
    EXPECT_NE(dt, sizes.end()) << name << ": dtype " << v["dtype"].dump();
    int64_t elems = 1;
    for (const auto& d : v["shape"]) {
      EXPECT_TRUE(d.is_number_unsigned()) << name << ": shape " << v["shape"].dump();
      elems *= d.get<int64_t>();
    }
    const auto& o = v["data_offsets"];
    EXPECT_TRUE(o.is_array() && o.size() == 2 && o[0].is_number_unsigned() &&
                o[1].is_number_unsigned() && o[0] <= o[1])
        << name << ": data_offsets " << o.dump();
    if (dt == sizes.end() || !o.is_array() || o.size() != 2) continue;
    const int64_t begin = o[0].get<int64_t>(), end = o[1].get<int64_t>();
    EXPECT_EQ(end - begin, elems * dt->second) << name << ": bytes of " << v.dump();
    spans.emplace_back(begin, end);
  }
  std::sort(spans.begin(), spans.end());
  int64_t at = 0;
  for (const auto& [begin, end] : spans) {
    EXPECT_EQ(begin, at) << "a gap or an overlap in the data region";
    at = end;
  }
  EXPECT_EQ(at, static_cast<int64_t>(b.size() - 8 - n)) << "the tensors must fill the data region";
  return names;
}

// Hugging Face form for both families: the folder has transformers' names and a config.json
// that maps back to the same model, its model.safetensors follows the format's specification
// (checked without nxd's reader), and export-hf then import-hf (at TP 2) is bitwise.
TEST(Offline, HuggingFaceRoundTripBothFamilies) {
  const nxd::testing::ScratchDir root_scratch("nxd_offline_");
  const fs::path& root = root_scratch.path;
  for (const char* arch : {"llama", "gpt_neox"}) {
    ModelConfig c = nxd::testing::ckpt_model_config(1);
    c.arch = arch;
    if (c.arch == "gpt_neox") c.num_kv_heads = 0, c.rotary_pct = 0.5, c.gelu_tanh = true;
    auto m = make_causal_lm(c, 4);
    const fs::path src = root / arch / "src", hf = root / arch / "hf", back = root / arch / "back";
    save_checkpoint(src, "a", m.get(), nullptr, nullptr);
    export_hf(src / "a", hf);
    const auto j = nlohmann::json::parse(nxd::testing::slurp(hf / "config.json"));
    EXPECT_EQ(j["model_type"], arch);
    EXPECT_EQ(j["architectures"][0], c.arch == "llama" ? "LlamaForCausalLM" : "GPTNeoXForCausalLM");
    EXPECT_EQ(j["num_hidden_layers"], 2);
    EXPECT_EQ(j["intermediate_size"], c.ffn_size());
    ModelConfig r = model_config_from_hf(j);
    EXPECT_EQ(r.arch, c.arch);
    EXPECT_EQ(r.kv_heads(), c.kv_heads());
    EXPECT_EQ(r.gelu_tanh, c.gelu_tanh);
    const auto names = read_map(hf / "model.safetensors");
    const auto spec_names = check_safetensors_spec(hf / "model.safetensors");
    EXPECT_EQ(spec_names.size(), m->state_dict().size());
    for (const auto& n : spec_names) EXPECT_TRUE(m->state_dict().contains(n)) << n;
    EXPECT_TRUE(names.count(c.arch == "llama"
                                ? "model.layers.0.self_attn.q_proj.weight"
                                : "gpt_neox.layers.0.attention.query_key_value.weight"));
    import_hf(hf, back, "b", 2, 1);
    auto m2 = make_causal_lm(c, 99);
    load_checkpoint(back, m2.get(), nullptr, nullptr);
    for (const auto& [n, x] : m->state_dict())
      EXPECT_TRUE(nxd::testing::bitwise_equal(m2->state_dict().at(n), x.detach(), n));
  }
  nlohmann::json bad = {{"model_type", "bert"}};
  EXPECT_THROW(model_config_from_hf(bad), CheckpointError);
}

// ZeRO-1 state (of AdamW, and of Lion) at TP2 x DP2 resharded offline to TP1 x DP2, TP4 x DP1
// and TP2 x PP2 x DP1 stays ZeRO-1 (a file per DP rank) and holds the same state: loaded into the
// unsharded optimizer on one rank, bitwise the original's.
TEST(Offline, ReshardKeepsZero1State) {
  const nxd::testing::ScratchDir root_scratch("nxd_offline_");
  for (const bool lion : {false, true}) {
    const fs::path root = root_scratch.path / (lion ? "lion" : "adamw");
    run_ranks(4, [&] {
      parallel_state::initialize_model_parallel(2);
      nxd::testing::Zero1Trainee t(2, {.zero1 = true, .lion = lion});
      t.step(0, nxd::testing::shards_of(parallel_state::get_data_parallel_rank(), 2));
      t.step(1, nxd::testing::shards_of(parallel_state::get_data_parallel_rank(), 2));
      save_checkpoint(root / "src", "s", t.model.get(), t.opt.get(), t.sched.get());
    });
    nxd::testing::Zero1Trainee want(1, {.seed = 9, .lion = lion});
    load_checkpoint(root / "src", want.model.get(), want.opt.get(), nullptr);
    const auto expected = nxd::testing::snapshot(*want.model, want.opt.get());
    struct Case {
      const char* name;
      int tp, dp, pp;
    };
    for (const Case& c :
         {Case{"tp1dp2", 1, 2, 1}, Case{"tp4dp1", 4, 1, 1}, Case{"tp2pp2", 2, 1, 2}}) {
      const std::string what = std::string(lion ? "Lion " : "AdamW ") + c.name;
      reshard_checkpoint(root / "src/s", root / c.name, {.tp = c.tp, .pp = c.pp, .dp = c.dp});
      const auto m = read_metadata(root / c.name / "s");
      EXPECT_EQ(m["parallel"]["zero1"], true) << what;
      EXPECT_EQ(m["parallel"]["dp"], c.dp) << what;
      EXPECT_EQ(m["optimizer"]["info"]["kind"], lion ? "Lion" : "AdamW") << what;
      EXPECT_GT(verify_checkpoint(root / c.name / "s").tensors, 0);
      nxd::testing::Zero1Trainee got(1, {.seed = 8, .lion = lion});
      load_checkpoint(root / c.name, got.model.get(), got.opt.get(), nullptr);
      nxd::testing::expect_same(nxd::testing::snapshot(*got.model, got.opt.get()), expected, what);
    }
  }
}

TEST(Offline, VerifyNamesTheFirstBadTensor) {
  const nxd::testing::ScratchDir root_scratch("nxd_offline_");
  const fs::path& root = root_scratch.path;
  Trainee t(1);
  save_checkpoint(root, "a", t.model.get(), t.opt.get(), nullptr);
  const auto r = verify_checkpoint(root / "a");
  EXPECT_EQ(r.files, 3);  // model, optim, user_content.json
  const fs::path f = root / "a/model/dp_rank_00_tp_rank_00_pp_rank_00.safetensors";
  io::SafetensorsReader rd(f);
  const io::TensorInfo& first = rd.header().tensors.front();
  {
    std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
    s.seekp(rd.header().data_start + first.begin + 1);
    s.put('\x7f');
  }
  try {
    verify_checkpoint(root / "a");
    ADD_FAILURE() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'" + first.name + "'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_checkpoint(root / "none"), CheckpointError);
}

TEST(Offline, ModelConfigJsonRoundTrip) {
  ModelConfig c = nxd::testing::ckpt_model_config(4);
  c.arch = "gpt_neox";
  c.rotary_pct = 0.5;
  c.dtype = DType::bf16;
  c.tie_word_embeddings = true;
  const ModelConfig d = model_config_from_json(model_config_json(c));
  EXPECT_EQ(model_config_json(d), model_config_json(c));
  EXPECT_EQ(d.dtype, DType::bf16);
  EXPECT_THROW(model_config_from_json(nlohmann::json{{"arch", "llama"}}), CheckpointError);
}

}  // namespace
}  // namespace nxd::ckpt

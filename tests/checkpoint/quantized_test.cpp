// Quantized checkpoints (checkpoint/quantized.h): written once, loaded they equal quantizing at
// load bitwise (values, scales, minimums, logits) at TP 1 and TP 2; TP 2 equals TP 1 within
// rounding; a damaged file or a wrong key is refused naming the file and the key; an existing
// OUT is never overwritten; a loaded model holds no f32 weight for its quantized layers and
// refuses to be saved.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/model_source.h"
#include "nxd/checkpoint/quantized.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/io/safetensors.h"
#include "nxd/layers/models/quantize_lm.h"
#include "quantized_util.h"
#include "support/files.h"
#include "support/tiny_models.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;

struct QuantizedFixture : ::testing::Test {
  nxd::testing::ScratchDir dir{"nxd_quantized_"};
  void SetUp() override {
    auto m = make_causal_lm(nxd::testing::quality_model("llama"), 3);
    save_checkpoint(dir.path / "run", "step_1", m.get(), nullptr, nullptr);
  }
  std::string run() const { return (dir.path / "run").string(); }
};

TEST_F(QuantizedFixture, LoadedEqualsQuantizedAtLoadBitwiseAtTp1AndTp2) {
  for (const char* spec : {"int8", "int4:32:asym", "int4:64"}) {
    const QuantizeOptions o = parse_weight_quant(spec);
    const fs::path out = dir.path / (std::string("q_") + spec[3] + (o.group == 64 ? "64" : ""));
    const auto rep = quantize_checkpoint(dir.path / "run/step_1", out, o);
    EXPECT_EQ(rep.summary.layers, 4 * 7) << spec;  // q, k, v, o, gate, up, down per layer
    for (int tp : {1, 2}) {
      const Loaded file = load(out.string(), tp, nullptr);
      const Loaded at = load(run(), tp, &o);
      for (int r = 0; r < tp; ++r) {
        ASSERT_FALSE(file.bytes[r].empty()) << spec;
        EXPECT_TRUE(file.bytes[r] == at.bytes[r]) << spec << " tp " << tp << " rank " << r;
      }
      ASSERT_EQ(file.logits.size(), at.logits.size());
      EXPECT_EQ(0, std::memcmp(file.logits.data(), at.logits.data(), file.logits.size() * 4))
          << spec << " tp " << tp;
    }
    // TP 2 against TP 1: the same weights, sums in another order
    const Loaded one = load(out.string(), 1, nullptr), two = load(out.string(), 2, nullptr);
    double diff = 0, top = 0;
    for (size_t i = 0; i < one.logits.size(); ++i) {
      diff = std::max(diff, std::abs(double(one.logits[i]) - two.logits[i]));
      top = std::max(top, std::abs(double(one.logits[i])));
    }
    std::printf("%s: TP 2 vs TP 1 largest logit difference %.3g (largest |logit| %.3g)\n", spec,
                diff, top);
    EXPECT_LT(diff, 1e-4 * std::max(1.0, top)) << spec;  // f32 sums of 128..256 terms
    const QuantizedVerifyReport v = verify_quantized_checkpoint(out);
    EXPECT_EQ(v.layers, 28);
    EXPECT_EQ(v.format, describe(o));
  }
}

TEST_F(QuantizedFixture, LoadedLayersHoldNoF32WeightAndSavingThemIsRefused) {
  const fs::path out = dir.path / "q8";
  quantize_checkpoint(dir.path / "run/step_1", out, parse_weight_quant("int8"));
  ModelSource s = resolve_model_source({.tool = "test", .checkpoint = out.string(), .tp = 1});
  sim::launch(1, [&] {
    parallel_state::initialize_model_parallel(1);
    auto m = build_model(s);
    auto fp32 = make_causal_lm(nxd::testing::quality_model("llama"), 3);
    const WeightBytes q = resident_weight_bytes(*m), d = resident_weight_bytes(*fp32);
    std::printf("    loaded int8 checkpoint: %lld weight bytes (fp32 model %lld)\n",
                (long long)q.total(), (long long)d.total());
    EXPECT_LT(q.total(), d.total() / 2);  // the linear layers are ~90% of this model's weights
    std::string first;
    for (auto& [name, mod] : m->named_modules())
      if (auto* l = dynamic_cast<QuantizableLinear*>(mod); l && l->quantized()) {
        EXPECT_TRUE(mod->get_parameter("weight").is_meta()) << name;
        if (first.empty()) first = name;
      }
    try {
      save_checkpoint(dir.path / "again", "step_1", m.get(), nullptr, nullptr);
      ADD_FAILURE() << "saved a model whose quantized layers have no f32 weight";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(first), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("save_checkpoint"), std::string::npos) << e.what();
    }
  });
  EXPECT_FALSE(fs::exists(dir.path / "again" / "step_1"));
}

TEST_F(QuantizedFixture, DamagedFilesAndWrongKeysAreRefusedNamingFileAndKey) {
  const fs::path good = dir.path / "good";
  // int8 activations (:q8) are chosen at load: a file cannot record them, so they are refused
  try {
    quantize_checkpoint(dir.path / "run/step_1", good, parse_weight_quant("int4:32:q8"));
    ADD_FAILURE() << "int4:32:q8 was written";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("int8 activations"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(good / kQuantizedFile));
  quantize_checkpoint(dir.path / "run/step_1", good, parse_weight_quant("int4:32:asym"));
  const std::string w = "model.layers.1.mlp.down_proj.weight";
  int n = 0;
  auto fresh = [&] {
    const fs::path p = dir.path / ("bad" + std::to_string(n++));
    fs::create_directories(p);
    fs::copy_file(good / kQuantizedFile, p / kQuantizedFile);
    return p;
  };
  {  // a flipped byte in a tensor's data: its checksum
    const fs::path p = fresh();
    io::SafetensorsReader r(p / kQuantizedFile);
    const io::TensorInfo* t = r.header().find(w + ".qweight");
    ASSERT_NE(t, nullptr);
    std::fstream f(p / kQuantizedFile, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(r.header().data_start + t->begin + 5);
    f.put('\x5a');
    f.close();
    expect_refused(p, w + ".qweight", "");
  }
  {  // truncated
    const fs::path p = fresh();
    fs::resize_file(p / kQuantizedFile, fs::file_size(p / kQuantizedFile) - 100);
    expect_refused(p, "", "");
  }
  using Tensors = std::vector<std::pair<std::string, Tensor>>;
  using Meta = std::map<std::string, std::string>;
  const std::vector<std::tuple<std::string, std::string, std::function<void(Tensors&, Meta&)>>>
      cases = {
          {"nxd.quantized.layout", "layout version '3'",
           [](Tensors&, Meta& m) { m["nxd.quantized.layout"] = "3"; }},
          {"nxd.quantized.format", "'int5'",
           [](Tensors&, Meta& m) { m["nxd.quantized.format"] = "int5"; }},
          {"nxd.quantized.group", "unknown weight format 'int4:48:asym'",
           [](Tensors&, Meta& m) { m["nxd.quantized.group"] = "48"; }},
          {"nxd.quantized.zero", "missing",
           [](Tensors&, Meta& m) { m.erase("nxd.quantized.zero"); }},
          {w + ".scales", "the layout needs F32[128,8]",  // down_proj: 256 inputs, groups of 32
           [&](Tensors& t, Meta&) {
             for (auto& [k, v] : t)
               if (k == w + ".scales") v = zeros({128, 4}, DType::f32);
           }},
          {w + ".mins", "missing",
           [&](Tensors& t, Meta&) {
             std::erase_if(t, [&](const auto& e) { return e.first == w + ".mins"; });
           }},
          {w + ".scales", "not finite",
           [&](Tensors& t, Meta&) {
             for (auto& [k, v] : t)
               if (k == w + ".scales") v.data<float>()[3] = std::nanf("");
           }},
          {"model.norm.weight", "missing",
           [&](Tensors& t, Meta&) {
             std::erase_if(t, [&](const auto& e) { return e.first == "model.norm.weight"; });
           }},
          {"extra", "is not a tensor of the model",
           [&](Tensors& t, Meta&) { t.emplace_back("extra", zeros({2}, DType::f32)); }},
          {"nxd.quantized.layers", "does not list the model's layer " + w,
           [&](Tensors&, Meta& m) {
             nlohmann::json l = nlohmann::json::parse(m["nxd.quantized.layers"]);
             l.erase(std::remove(l.begin(), l.end(), w), l.end());
             m["nxd.quantized.layers"] = l.dump();
           }},
      };
  for (const auto& [key, what, edit] : cases) {
    const fs::path p = fresh();
    rewrite(p, edit);
    expect_refused(p, key, what);
  }
}

TEST_F(QuantizedFixture, AnExistingOutIsNeverOverwritten) {
  const QuantizeOptions o = parse_weight_quant("int8");
  const fs::path full = dir.path / "full", file = dir.path / "file";
  fs::create_directories(full);
  std::ofstream(full / "mine.txt") << "a user's work";
  std::ofstream(file) << "a user's file";
  for (const fs::path& out : {full, file}) {
    try {
      quantize_checkpoint(dir.path / "run/step_1", out, o);
      ADD_FAILURE() << "wrote into " << out;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(out.string() + " exists and is not an empty folder"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(fs::exists(full / "mine.txt"));
  EXPECT_FALSE(fs::exists(full / kQuantizedFile));
  EXPECT_EQ(fs::file_size(file), 13u);
  fs::create_directories(dir.path / "empty");  // an empty folder is fine
  quantize_checkpoint(dir.path / "run/step_1", dir.path / "empty", o);
  EXPECT_TRUE(is_quantized_checkpoint(dir.path / "empty"));
}

}  // namespace
}  // namespace nxd::ckpt

// A quantized output head (QuantizeOptions::head, ":head" in the format; checkpoint/quantized.h
// layout 2): nxd-ckpt quantize's file loaded equals quantizing at load bitwise (every quantized
// tensor, the head's included, and the logits) at TP 1 and TP 2, for an untied head (its f32
// weight freed, absent from the file) and a tied one (the embedding kept for the input lookup,
// the head's quantized copy beside it); the head moves the logits; damage to the head's tensors
// or keys is refused naming the file and the key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <tuple>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/error.h"
#include "nxd/checkpoint/gguf_llama.h"
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

struct QuantizedHeadFixture : ::testing::Test {
  nxd::testing::ScratchDir dir{"nxd_quantized_head_"};
  fs::path save(bool tied) {
    ModelConfig c = nxd::testing::quality_model("llama");
    c.tie_word_embeddings = tied;
    auto m = make_causal_lm(c, 3);
    const fs::path run = dir.path / (tied ? "tied" : "untied");
    save_checkpoint(run, "step_1", m.get(), nullptr, nullptr);
    return run;
  }
};

TEST_F(QuantizedHeadFixture, LoadedEqualsQuantizedAtLoadBitwiseTiedAndUntiedAtTp1AndTp2) {
  for (bool tied : {false, true}) {
    const fs::path run = save(tied);
    const std::string emb = "model.embed_tokens.weight";
    const std::string hw = tied ? emb : "lm_head.weight";
    for (const char* spec : {"int8:head", "int4:32:asym:head", "int4:64:head=int4"}) {
      SCOPED_TRACE(str(spec, tied ? " tied" : " untied"));
      const QuantizeOptions o = parse_weight_quant(spec);
      const fs::path out = dir.path / str("q", tied, "_", o.format == WeightQuant::int8 ? 8 : 4,
                                          o.group, static_cast<int>(o.head));
      const auto rep = quantize_checkpoint(run / "step_1", out, o);
      EXPECT_EQ(rep.summary.layers, 28);
      EXPECT_EQ(rep.head.layers, 1);
      EXPECT_EQ(rep.head.weights, 256 * 128);
      EXPECT_LT(rep.head.bytes_after, rep.head.bytes_before / 3);
      {  // the file: the head's quantized tensors under its weight's name
        io::SafetensorsReader r(out / kQuantizedFile);
        EXPECT_EQ(r.header().metadata.at("nxd.quantized.layout"), "2");
        EXPECT_EQ(r.header().metadata.at("nxd.quantized.head"), weight_quant_name(o.head));
        EXPECT_NE(r.header().find(hw + ".qweight"), nullptr);
        EXPECT_NE(r.header().find(hw + ".scales"), nullptr);
        EXPECT_EQ(r.header().find(hw) != nullptr, tied) << "the f32 head only as the embedding";
        EXPECT_NE(r.header().find(emb), nullptr);
      }
      const QuantizeOptions layers_only = with_format(o, o.format);
      const Loaded plain = load(run.string(), 1, &layers_only);
      for (int tp : {1, 2}) {
        const Loaded file = load(out.string(), tp, nullptr);
        const Loaded at = load(run.string(), tp, &o);
        for (int r = 0; r < tp; ++r)
          EXPECT_TRUE(file.bytes[r] == at.bytes[r]) << "tp " << tp << " rank " << r;
        ASSERT_EQ(file.logits.size(), at.logits.size());
        EXPECT_EQ(0, std::memcmp(file.logits.data(), at.logits.data(), file.logits.size() * 4))
            << "tp " << tp;
        EXPECT_EQ(std::count(file.names.begin(), file.names.end(), "lm_head.qweight"), 1);
        EXPECT_EQ(std::count(file.names.begin(), file.names.end(), "lm_head.scales"), 1);
        EXPECT_EQ(file.head_weight_meta, !tied) << "a tied head keeps the embedding";
        EXPECT_EQ(at.head.layers, 1);
      }
      // the head's rounding moves the logits, within what its error allows
      const Loaded one = load(out.string(), 1, nullptr);
      double diff = 0, top = 0;
      for (size_t i = 0; i < one.logits.size(); ++i) {
        diff = std::max(diff, std::abs(double(one.logits[i]) - plain.logits[i]));
        top = std::max(top, std::abs(double(plain.logits[i])));
      }
      std::printf("    %s %s: head quantized vs not, largest logit change %.3g (|logit| %.3g)\n",
                  spec, tied ? "tied" : "untied", diff, top);
      EXPECT_GT(diff, 0.0);
      EXPECT_LT(diff, 0.5 * top);
      const QuantizedVerifyReport v = verify_quantized_checkpoint(out);
      EXPECT_EQ(v.format, describe(o));
    }
  }
}

TEST_F(QuantizedHeadFixture, DamagedHeadTensorsAndKeysAreRefusedNamingFileAndKey) {
  using Tensors = std::vector<std::pair<std::string, Tensor>>;
  using Meta = std::map<std::string, std::string>;
  using Case = std::tuple<std::string, std::string, std::function<void(Tensors&, Meta&)>>;
  auto drop = [](const std::string& key) {
    return [key](Tensors& t, Meta&) {
      std::erase_if(t, [&](const auto& e) { return e.first == key; });
    };
  };
  int n = 0;
  for (bool tied : {false, true}) {
    const fs::path good = dir.path / str("good", tied);
    quantize_checkpoint(save(tied) / "step_1", good, parse_weight_quant("int4:32:head"));
    const std::string h = tied ? "model.embed_tokens.weight" : "lm_head.weight";
    const std::vector<Case> cases = {
        {"nxd.quantized.head", "missing (layout 2 quantizes the output head)",
         [](Tensors&, Meta& m) { m.erase("nxd.quantized.head"); }},
        {"nxd.quantized.head", "'int5' (int8 or int4)",
         [](Tensors&, Meta& m) { m["nxd.quantized.head"] = "int5"; }},
        {"nxd.quantized.head", "present in a layout 1 file",
         [](Tensors&, Meta& m) { m["nxd.quantized.layout"] = "1"; }},
        {h + ".scales", "missing", drop(h + ".scales")},
        {h + ".qweight", "missing", drop(h + ".qweight")},
        {h + ".qweight", "the layout needs I32[256,32]",  // int8: 128 bytes per row
         [&](Tensors& t, Meta&) {
           for (auto& [k, v] : t)
             if (k == h + ".qweight") v = zeros({256, 16}, DType::i32);
         }},
        {h + ".scales", "not finite",
         [&](Tensors& t, Meta&) {
           for (auto& [k, v] : t)
             if (k == h + ".scales") v.data<float>()[7] = INFINITY;
         }},
        // a head written as int8 read as int4 (the metadata's): its tensors' shapes
        {h + ".qweight", "the layout needs I32[256,16]",
         [](Tensors&, Meta& m) { m["nxd.quantized.head"] = "int4"; }},
        {"model.embed_tokens.weight", "missing", drop("model.embed_tokens.weight")},
    };
    for (const auto& [key, what, edit] : cases) {
      const fs::path p = dir.path / str("bad", n++);
      fs::create_directories(p);
      fs::copy_file(good / kQuantizedFile, p / kQuantizedFile);
      rewrite(p, edit);
      SCOPED_TRACE(str(tied ? "tied: " : "untied: ", key, " ", what));
      expect_refused(p, key, what);
    }
  }
}

// A GGUF file's q4_0 / q8_0 output head stays quantized (nxd-generate / nxd-serve --gguf build it
// through build_model): q4_0 exactly (its dequantized int4 head equals the file's f32 values
// bitwise), q8_0 requantized per row (within half the row's scale of the file's values); an
// untied head's f32 weight is freed, a tied one's embedding kept; TP 2 ranks hold the rows of
// TP 1's head.
TEST_F(QuantizedHeadFixture, GgufQuantizedHeadIsKept) {
  for (bool tied : {false, true})
    for (io::GgmlType type : {io::GgmlType::q4_0, io::GgmlType::q8_0}) {
      SCOPED_TRACE(
          str(io::ggml_type_name(static_cast<uint32_t>(type)), tied ? " tied" : " untied"));
      const fs::path run = save(tied);
      const fs::path file =
          dir.path / str("m", tied, io::ggml_type_name(static_cast<uint32_t>(type)), ".gguf");
      export_gguf(run / "step_1", file, {.type = type});
      ModelSource s = resolve_model_source({.tool = "test", .gguf = file.string(), .tp = 1});
      ASSERT_NE(s.head, nullptr);
      const std::string hw = tied ? "model.embed_tokens.weight" : "lm_head.weight";
      const Tensor f32 = s.full.at(hw);         // the file's values, dequantized
      std::vector<std::vector<float>> rows(2);  // TP 1's head, TP 2's ranks' rows concatenated
      for (int tp : {1, 2}) {
        ModelSource st = resolve_model_source({.tool = "test", .gguf = file.string(), .tp = tp});
        std::vector<std::vector<float>> part(tp);
        sim::launch(tp, [&] {
          parallel_state::initialize_model_parallel(tp);
          auto m = build_model(st);
          const QuantizableLinear& h = m->output_head_weights();
          ASSERT_TRUE(type == io::GgmlType::q4_0 ? bool(h.int4_weight()) : bool(h.int8_weight()));
          EXPECT_EQ(m->output_head_weight().is_meta(), !tied);
          const Tensor d =
              h.int4_weight() ? h.int4_weight()->dequantize() : h.int8_weight()->dequantize();
          part[parallel_state::get_tensor_model_parallel_rank()].assign(
              d.data<float>(), d.data<float>() + d.numel());
        });
        for (auto& p : part) rows[tp - 1].insert(rows[tp - 1].end(), p.begin(), p.end());
      }
      EXPECT_TRUE(rows[0] == rows[1]) << "TP 2's rows are TP 1's";
      ASSERT_EQ(static_cast<int64_t>(rows[0].size()), f32.numel());
      const float* want = f32.data<float>();
      if (type == io::GgmlType::q4_0) {
        EXPECT_EQ(0, std::memcmp(rows[0].data(), want, rows[0].size() * 4)) << "exact";
      } else {
        const int64_t H = f32.size(1);
        for (int64_t r = 0; r < f32.size(0); ++r) {
          double amax = 0;
          for (int64_t j = 0; j < H; ++j) amax = std::max(amax, std::abs(double(want[r * H + j])));
          for (int64_t j = 0; j < H; ++j)
            ASSERT_LE(std::abs(double(rows[0][r * H + j]) - want[r * H + j]),
                      0.5 * amax / 127 * (1 + 1e-5))
                << "row " << r << " col " << j;
        }
      }
    }
}

// A format's head part: ":head" is int8 (llama.cpp's Q8_0 heads), ":head=int4" the layers' int4
// form; it comes last, and describe says it.
TEST(QuantizedHeadFormat, ParsedDescribedAndRefusedByName) {
  const QuantizeOptions a = parse_weight_quant("int4:head");
  EXPECT_EQ(a.format, WeightQuant::int4);
  EXPECT_EQ(a.head, WeightQuant::int8);
  EXPECT_EQ(describe(a), "int4 (groups of 32, symmetric), head int8");
  EXPECT_EQ(parse_weight_quant("int8").head, WeightQuant::none);
  const QuantizeOptions b = parse_weight_quant("int8:head=int4");
  EXPECT_EQ(b.head, WeightQuant::int4);
  EXPECT_EQ(describe(b), "int8, head int4 (groups of 32, symmetric)");
  const QuantizeOptions c = parse_weight_quant("int4:128:asym:head=int4");
  EXPECT_EQ(describe(c), "int4 (groups of 128, asymmetric), head int4");
  for (const char* bad : {"int8:32", "int4:head:64", "int8:head=int2", "int8:head:head", "head"}) {
    try {
      parse_weight_quant(bad);
      ADD_FAILURE() << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(str("'", bad, "'")), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace nxd::ckpt

// A quantized model holds only its quantized weights (layers/quantize.h): the f32 weights of its
// quantized layers are freed (meta tensors of the same shape), the host memory counter drops
// by exactly their bytes, resident_weight_bytes reports fp32 / int8 / int4 figures, generation is
// unchanged (the quantize tests generate after it), and anything that would read a freed weight
// refuses naming the layer.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/models/quantize_lm.h"
#include "nxd/layers/parallel/lora.h"
#include "nxd/layers/quantize.h"
#include "nxd/runtime/allocator.h"
#include "support/tiny_models.h"

using namespace nxd;

namespace {

struct Figures {
  WeightBytes bytes;
  QuantizeSummary summary;
  int64_t live_drop = 0;  // bytes the process's host memory counter lost at quantization
};

Figures quantized_figures(const ModelConfig& c, const std::string& spec) {
  auto m = make_causal_lm(c, 5);
  Figures f;
  const int64_t live = device_memory(Device::host).live();
  f.summary = quantize_causal_lm(*m, {}, parse_weight_quant(spec)).summary;
  f.live_drop = live - device_memory(Device::host).live();
  f.bytes = resident_weight_bytes(*m);
  for (auto& [name, mod] : m->named_modules())
    if (auto* q = dynamic_cast<QuantizableLinear*>(mod); q && q->quantized())
      EXPECT_TRUE(mod->get_parameter("weight").is_meta()) << name << ".weight was not freed";
  return f;
}

}  // namespace

TEST(QuantizedMemory, FreesTheF32WeightsAndReportsInt8AndInt4ResidentBytes) {
  const ModelConfig c = nxd::testing::quality_model("llama");
  auto fp32 = make_causal_lm(c, 5);
  const WeightBytes dense = resident_weight_bytes(*fp32);
  EXPECT_EQ(dense.quantized, 0);
  for (const std::string spec : {"int8", "int4:32", "int4:64:asym"}) {
    SCOPED_TRACE(spec);
    const Figures f = quantized_figures(c, spec);
    const double linear = static_cast<double>(f.summary.bytes_after) / f.summary.bytes_before;
    std::printf(
        "    %-12s weights %lld B (fp32 %lld B, %.3fx); linear layers %lld -> %lld B (%.3fx)\n",
        spec.c_str(), static_cast<long long>(f.bytes.total()),
        static_cast<long long>(dense.total()), static_cast<double>(f.bytes.total()) / dense.total(),
        static_cast<long long>(f.summary.bytes_before),
        static_cast<long long>(f.summary.bytes_after), linear);
    // the freed f32 weights minus the quantized tensors (host tensors too)
    EXPECT_EQ(f.live_drop, f.summary.bytes_before - f.summary.bytes_after);
    EXPECT_EQ(f.bytes.dense, dense.total() - f.summary.bytes_before);
    EXPECT_EQ(f.bytes.quantized, f.summary.bytes_after);
    // int8: a byte per weight and an f32 scale per row; int4:32 0.5 byte + 4/32 (scale)
    EXPECT_LE(linear, spec == "int8" ? 0.3 : spec == "int4:32" ? 0.17 : 0.2);
  }
}

// ":head": an untied head's f32 weight is freed like a layer's (the memory counter drops by it
// minus the int8 bytes); a tied head keeps the embedding (the lookup reads it) and adds its int8
// copy, which resident_weight_bytes counts; the head is refused a second quantization.
TEST(QuantizedMemory, QuantizedHeadFreesAnUntiedWeightAndAddsATiedCopy) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    ModelConfig c = nxd::testing::quality_model("llama");
    c.tie_word_embeddings = tied;
    auto m = make_causal_lm(c, 5);
    const WeightBytes dense = resident_weight_bytes(*m);
    const int64_t live = device_memory(Device::host).live();
    const QuantizedLmReport r = quantize_causal_lm(*m, {}, parse_weight_quant("int4:32:head"));
    const int64_t drop = live - device_memory(Device::host).live();
    const WeightBytes b = resident_weight_bytes(*m);
    const int64_t head_f32 = c.vocab_size * c.hidden_size * 4;
    EXPECT_EQ(r.head.layers, 1);
    EXPECT_EQ(r.head.bytes_before, head_f32);
    EXPECT_EQ(r.head.bytes_after, c.vocab_size * (c.hidden_size + 4));  // int8 values, scales
    EXPECT_EQ(b.quantized, r.summary.bytes_after + r.head.bytes_after);
    const int64_t layers_drop = r.summary.bytes_before - r.summary.bytes_after;
    EXPECT_EQ(drop, layers_drop + (tied ? -r.head.bytes_after : head_f32 - r.head.bytes_after));
    EXPECT_EQ(b.dense, dense.total() - r.summary.bytes_before - (tied ? 0 : head_f32));
    EXPECT_EQ(m->output_head_weight().is_meta(), !tied);
    std::printf("    %s head: weights %lld B (without the head quantized: %lld B)\n",
                tied ? "tied" : "untied", static_cast<long long>(b.total()),
                static_cast<long long>(b.total() - r.head.bytes_after + (tied ? 0 : head_f32)));
    EXPECT_THROW(quantize_output_head(*m, WeightQuant::int8, {}), InvalidArgument);
  }
}

TEST(QuantizedMemory, ReadingAFreedWeightRefusesNamingTheLayer) {
  const ModelConfig c = nxd::testing::quality_model("llama");
  auto m = make_causal_lm(c, 5);
  quantize_causal_lm(*m, {}, parse_weight_quant("int4:32"));
  std::string layer;  // the first quantized layer
  for (auto& [name, mod] : m->named_modules())
    if (auto* q = dynamic_cast<QuantizableLinear*>(mod); q && q->quantized() && layer.empty())
      layer = name;
  ASSERT_FALSE(layer.empty());
  const Tensor w = m->get_parameter(layer + ".weight");
  EXPECT_TRUE(w.is_meta());
  EXPECT_THROW(w.data<float>(), std::exception);  // never a read of freed memory
  auto expect_refused = [&](const std::function<void()>& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << what << " was not refused";
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("int4-quantized"), std::string::npos) << msg;
      EXPECT_NE(msg.find(layer), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  };
  expect_refused([&] { check_no_quantized_layers(*m, "export"); }, "export");
  LoraConfig lc;
  lc.target_modules = {"q_proj"};
  expect_refused([&] { apply_lora(*m, lc, 1); }, "lora");
}

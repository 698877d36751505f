// Traced decoders of quantized models (layers/quantize.h: the int8_linear / int4_linear ops whose
// parameters are the quantized tensors): prefill and decode logits equal the eager quantized
// KV-cache path bitwise at TP 1 and TP 2 for int8, int4:32, int4:64:asym and int4:32:q8 (int8
// activations: the op's act attribute), the graph holds no
// f32 weight of a quantized layer, a saved-then-loaded trace gives the same logits, and a damaged
// quantized tensor in the saved weights is refused naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "nxd/layers/models/kv_cache.h"
#include "nxd/layers/models/quantize_lm.h"
#include "nxd/layers/quantize.h"
#include "nxd/trace/decoder.h"
#include "nxd/trace/save_load.h"
#include "support/compare.h"
#include "support/files.h"
#include "support/tiny_models.h"
#include "trace_util.h"

using namespace nxd;
using namespace nxd::testing;

namespace {

const std::vector<int64_t> kPrompt = {3, 9, 27, 1, 14, 60, 2, 33};

ModelConfig qconfig() {
  ModelConfig c = quality_model("llama");  // row-parallel inputs per rank at TP 2: 64 and 128
  c.max_position_embeddings = 32;
  return c;
}

std::shared_ptr<CausalLM> quantized_model(const ModelConfig& cfg, const std::string& spec) {
  auto m = make_causal_lm(cfg, 7);
  m->eval();
  quantize_causal_lm(*m, {}, parse_weight_quant(spec));
  return m;
}

struct Logits {
  Tensor prefill, decode;
};

// The eager quantized KV-cache path on the current rank.
Logits eager_logits(const ModelConfig& cfg, const std::string& spec) {
  auto m = quantized_model(cfg, spec);
  NoGradGuard ng;
  KVCache c = m->make_kv_cache(1, cfg.max_position_embeddings);
  Logits e;
  e.prefill =
      m->forward_cached(from_vector<int64_t>(kPrompt, {1, 8}), make_cache_step({0}, {0}, {8}), c);
  e.decode =
      m->forward_cached(from_vector<int64_t>({5}, {1, 1}), make_cache_step({0}, {8}, {1}), c);
  return e;
}

// eager_logits on `tp` sim ranks: rank 0's.
Logits eager_logits_at(const ModelConfig& cfg, const std::string& spec, int tp) {
  Logits e;
  run_ranks(tp, [&] {
    parallel_state::initialize_model_parallel(tp);
    Logits r = eager_logits(cfg, spec);
    if (current_context().rank() == 0) e = r;
  });
  return e;
}

Logits traced_logits(trace::TensorParallelModel& d) {
  CacheStep s = make_cache_step({0}, {0}, {8});
  CacheStep t = make_cache_step({0}, {8}, {1});
  Logits r;
  r.prefill = d.forward({from_vector<int64_t>(kPrompt, {1, 8}), s.seq_ids, s.start, s.lengths})[0];
  r.decode = d.forward({from_vector<int64_t>({5}, {1, 1}), t.seq_ids, t.start, t.lengths})[0];
  return r;
}

std::shared_ptr<trace::TensorParallelModel> traced(const ModelConfig& cfg, const std::string& spec,
                                                   int tp) {
  return trace::trace_decoder([cfg, spec] { return quantized_model(cfg, spec); },
                              {.tp_degree = tp, .prefill_buckets = {8}, .max_len = 32});
}

}  // namespace

TEST(TraceQuantized, TracedEqualsEagerQuantizedBitwiseAtTp1AndTp2) {
  if (under_mpi()) GTEST_SKIP() << "sim only";
  const ModelConfig cfg = qconfig();
  for (const std::string spec : {"int8", "int4:32", "int4:64:asym", "int4:32:q8"})
    for (int tp : {1, 2}) {
      SCOPED_TRACE(spec + " tp=" + std::to_string(tp));
      const Logits e = eager_logits_at(cfg, spec, tp);
      auto d = traced(cfg, spec, tp);
      // the graphs read the quantized tensors, never a quantized layer's (freed) f32 weight
      for (const auto& g : d->ranks()[0].graphs) {
        int quantized_ops = 0, linear_ops = 0;
        for (const auto& n : g->graph.nodes) {
          quantized_ops += n.op == (spec == "int8" ? "int8_linear" : "int4_linear");
          linear_ops += n.op == "linear" || n.op == "linear_add";
        }
        EXPECT_EQ(quantized_ops, cfg.num_layers * 7);  // q, k, v, o, gate, up, down
        EXPECT_EQ(linear_ops, 1);                      // the output head, unquantized
      }
      for (const auto& [name, t] : d->ranks()[0].weights) EXPECT_FALSE(t.is_meta()) << name;
      const Logits t = traced_logits(*d);
      EXPECT_BITWISE_EQ(t.prefill, e.prefill);
      EXPECT_BITWISE_EQ(t.decode, e.decode);
    }
}

TEST(TraceQuantized, SavedAndLoadedQuantizedTraceEqualsAndDamageIsRefused) {
  if (under_mpi()) GTEST_SKIP() << "sim only";
  const ModelConfig cfg = qconfig();
  auto d = traced(cfg, "int4:64:asym", 2);
  const Logits want = traced_logits(*d);
  const auto dir = test_temp_dir("nxd_trace_q_") / "dec";
  trace::parallel_model_save(*d, dir);
  auto l = trace::parallel_model_load(dir);
  const Logits got = traced_logits(*l);
  EXPECT_BITWISE_EQ(got.prefill, want.prefill);
  EXPECT_BITWISE_EQ(got.decode, want.decode);
  // flip one byte of a quantized tensor's values in rank 1's weights: refused, naming the file
  const std::filesystem::path w = dir / "rank1" / "weights.safetensors";
  std::fstream f(w, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t hlen = 0;
  f.read(reinterpret_cast<char*>(&hlen), 8);
  std::string header(hlen, ' ');
  f.read(header.data(), static_cast<std::streamsize>(hlen));
  const nlohmann::json h = nlohmann::json::parse(header);
  int64_t at = -1;
  for (auto it = h.begin(); it != h.end(); ++it)
    if (it.key().find(".qweight") != std::string::npos) {
      EXPECT_EQ(it.value()["dtype"], "I32") << it.key();
      at = 8 + static_cast<int64_t>(hlen) + it.value()["data_offsets"][0].get<int64_t>();
      break;
    }
  ASSERT_GE(at, 0) << "no quantized tensor in " << w;
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(at);
  f.write(&c, 1);
  f.close();
  try {
    trace::parallel_model_load(dir);
    ADD_FAILURE() << "loaded a trace with a damaged quantized tensor";
  } catch (const trace::TraceError& e) {
    EXPECT_NE(std::string(e.what()).find(w.string()), std::string::npos) << e.what();
  }
}

// A quantized output head (":head" int8, ":head=int4"), untied and tied: the graphs hold no f32
// product at all (the head is one more quantized op, a tied head's copy a parameter "lm_head.*"
// beside the embedding the lookup reads), traced logits equal eager bitwise at TP 1 and 2, and a
// saved-then-loaded trace gives the same logits.
TEST(TraceQuantized, QuantizedHeadTracedEqualsEagerBitwiseTiedAndUntied) {
  if (under_mpi()) GTEST_SKIP() << "sim only";
  for (bool tied : {false, true})
    for (const std::string spec : {"int4:32:head", "int8:head=int4"})
      for (int tp : {1, 2}) {
        SCOPED_TRACE(spec + (tied ? " tied" : " untied") + " tp=" + std::to_string(tp));
        ModelConfig cfg = qconfig();
        cfg.tie_word_embeddings = tied;
        const Logits e = eager_logits_at(cfg, spec, tp);
        auto d = traced(cfg, spec, tp);
        const bool layers_int4 = spec.rfind("int4", 0) == 0;
        for (const auto& g : d->ranks()[0].graphs) {
          int int8_ops = 0, int4_ops = 0, linear_ops = 0;
          for (const auto& n : g->graph.nodes) {
            int8_ops += n.op == "int8_linear";
            int4_ops += n.op == "int4_linear";
            linear_ops += n.op == "linear" || n.op == "linear_add";
          }
          EXPECT_EQ(linear_ops, 0);
          EXPECT_EQ(layers_int4 ? int4_ops : int8_ops, cfg.num_layers * 7);
          EXPECT_EQ(layers_int4 ? int8_ops : int4_ops, 1);  // the head
        }
        bool head_param = false, embedding = false;
        for (const auto& [name, t] : d->ranks()[0].weights) {
          EXPECT_FALSE(t.is_meta()) << name;
          head_param |= name == "lm_head.qweight";
          embedding |= name == "model.embed_tokens.weight";
        }
        EXPECT_TRUE(head_param && embedding);
        const Logits t = traced_logits(*d);
        EXPECT_BITWISE_EQ(t.prefill, e.prefill);
        EXPECT_BITWISE_EQ(t.decode, e.decode);
        if (tp == 2) {
          const auto dir = test_temp_dir("nxd_trace_qh_") / "dec";
          trace::parallel_model_save(*d, dir);
          const Logits got = traced_logits(*trace::parallel_model_load(dir));
          EXPECT_BITWISE_EQ(got.prefill, t.prefill);
          EXPECT_BITWISE_EQ(got.decode, t.decode);
        }
      }
}

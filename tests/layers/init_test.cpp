// Initialization methods (layers/init_scheme.h): nxd (PyTorch's and NxD's layer defaults),
// normal and scaled_normal, checked per parameter by their statistics and bounds, bitwise against
// the init functions on the parameter's own stream, and, for TP in {2, 4}, every shard bitwise
// the slice of the single-rank parameter.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/runtime/rng.h"
#include "support/compare.h"
#include "support/ranks.h"

using namespace nxd;

namespace {

ModelConfig config(const std::string& arch, InitMethod method) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 64;
  c.num_layers = 4;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.num_kv_heads = arch == "llama" ? 2 : 0;
  c.ffn_hidden_size = 128;
  c.max_position_embeddings = 32;
  c.init_method = method;
  return c;
}

bool is_norm(const std::string& n) {
  return n.find("norm") != std::string::npos;
}
bool is_embedding(const std::string& n) {  // GPT-NeoX's head is "embed_out"
  return n.find("embed_tokens") != std::string::npos || n.find("embed_in") != std::string::npos;
}
bool is_residual_output(const std::string& n) {
  for (const char* s : {"o_proj", "down_proj", "attention.dense.", "dense_4h_to_h"})
    if (n.find(s) != std::string::npos) return true;
  return false;
}

struct Stats {
  double mean = 0, std = 0, max_abs = 0;
};
Stats stats(const Tensor& t) {
  std::vector<double> v = t.to_vector();
  Stats s;
  for (double x : v) s.mean += x / v.size();
  for (double x : v) {
    s.std += (x - s.mean) * (x - s.mean) / v.size();
    s.max_abs = std::max(s.max_abs, std::abs(x));
  }
  s.std = std::sqrt(s.std);
  return s;
}

// The weight of the module that owns `bias_name` (its fan-in is the weight's last dim).
int64_t fan_in_of_bias(const Module& m, const std::string& bias_name) {
  std::string w = bias_name.substr(0, bias_name.size() - 4) + "weight";
  return m.get_parameter(w).size(-1);
}

Tensor gather_full(Communicator& g, const Tensor& t, const ParallelAttrs& a) {
  if (!a.tensor_model_parallel) return t.detach();
  Tensor all = g.all_gather(t.detach().contiguous(), a.partition_dim);
  const int64_t m = a.kv_replicas, tp = g.size(), p = t.size(0);
  if (m == 1) return all;
  Shape s = all.shape(), blocks{tp / m, m, p};
  blocks.insert(blocks.end(), s.begin() + 1, s.end());
  Shape full = s;
  full[0] = tp / m * p;
  return all.view(blocks).select(1, 0).contiguous().reshape(full);
}

}  // namespace

TEST(InitMethods, NxdIsPyTorchsLayerDefaults) {
  for (std::string arch : {"llama", "gpt_neox"}) {
    auto m = make_causal_lm(config(arch, InitMethod::nxd), 5);
    int checked = 0;
    for (const auto& [name, t] : m->named_parameters()) {
      SCOPED_TRACE(arch + " " + name);
      const Stats s = stats(t);
      if (is_norm(name)) {
        EXPECT_EQ(s.max_abs, name.ends_with("bias") ? 0.0 : 1.0);
        continue;
      }
      if (is_embedding(name)) {  // normal(0, 1)
        EXPECT_NEAR(s.mean, 0.0, 0.08);
        EXPECT_NEAR(s.std, 1.0, 0.05);
        ++checked;
        continue;
      }
      // uniform(+-1/sqrt(fan_in)): within the bound, std bound/sqrt(3), and bitwise the uniform
      // draw of the parameter's own stream
      const int64_t fan_in = t.dim() == 1 ? fan_in_of_bias(*m, name) : t.size(-1);
      const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
      EXPECT_LE(s.max_abs, bound);
      EXPECT_GT(s.max_abs, 0.9 * bound);
      if (t.numel() >= 1024) {
        EXPECT_NEAR(s.std, bound / std::sqrt(3.0), 0.06 * bound);
        EXPECT_NEAR(s.mean, 0.0, 0.06 * bound);
      }
      Tensor ref = empty(t.shape());
      init::uniform(ref, RngStream{5, stream_id(name.c_str())}, -bound, bound);
      EXPECT_TRUE(nxd::testing::bitwise_equal(t.detach(), ref, name));
      ++checked;
    }
    EXPECT_GE(checked, arch == "llama" ? 1 + 4 * 7 + 1 : 1 + 4 * 8 + 1);
  }
}

TEST(InitMethods, NxdShardsAreSlicesOfTheSingleRankWeightsAtEveryTP) {
  for (std::string arch : {"llama", "gpt_neox"}) {
    ModelConfig c = config(arch, InitMethod::nxd);
    std::map<std::string, Tensor> full;
    for (const auto& [n, t] : make_causal_lm(c, 5)->named_parameters()) full[n] = t.detach();
    for (int tp : {2, 4}) {
      c.kv_size_multiplier = arch == "llama" ? std::max(1, tp / 2) : 1;
      nxd::testing::run_ranks(tp, [&] {
        parallel_state::initialize_model_parallel(tp);
        Communicator& g = parallel_state::get_tensor_model_parallel_group();
        auto m = make_causal_lm(c, 5);
        for (const auto& pp : parallel_parameters(*m))
          EXPECT_TRUE(
              nxd::testing::bitwise_equal(gather_full(g, pp.tensor, pp.attrs), full.at(pp.name),
                                          arch + " tp" + std::to_string(tp) + " " + pp.name));
      });
    }
  }
}

TEST(InitMethods, ScaledNormalScalesTheResidualOutputs) {
  for (std::string arch : {"llama", "gpt_neox"}) {
    ModelConfig c = config(arch, InitMethod::scaled_normal);
    c.init_std = 0.05;
    auto m = make_causal_lm(c, 9);
    const double scaled = 0.05 / std::sqrt(2.0 * 4);
    int residual = 0;
    for (const auto& [name, t] : m->named_parameters()) {
      SCOPED_TRACE(arch + " " + name);
      if (is_norm(name)) continue;
      if (t.dim() == 1) {  // projection biases start at zero
        EXPECT_EQ(stats(t).max_abs, 0.0);
        continue;
      }
      const double std = is_residual_output(name) ? scaled : 0.05;
      residual += is_residual_output(name);
      Tensor ref = empty(t.shape());
      init::normal(ref, RngStream{9, stream_id(name.c_str())}, 0.0, std);
      EXPECT_TRUE(nxd::testing::bitwise_equal(t.detach(), ref, name));
    }
    EXPECT_EQ(residual, 2 * 4);  // attention and MLP outputs of each layer
  }
}

TEST(InitMethods, NamesAndErrors) {
  EXPECT_EQ(parse_init_method("scaled_normal"), InitMethod::scaled_normal);
  EXPECT_STREQ(init_method_name(InitMethod::nxd), "nxd");
  try {
    parse_init_method("xavier");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'xavier'"), std::string::npos) << e.what();
  }
  // a fan_in_uniform rule no layer resolved is refused, naming the parameter
  Module mod("M");
  mod.register_parameter("w", zeros({2, 3}), ParamInit::fan_in_uniform());
  try {
    mod.init_parameters(1);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ParamInit::fan_in_uniform(2.0).for_fan_in(16).b, 0.5);
}

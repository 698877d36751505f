// NxD's config and optimizer wrapper (trainer/nxd_api.h): NxD's keys and defaults, the errors
// for impossible settings, and that the wrapper's step is the Trainer's (its training tests run
// on it) — here: it initializes parallel_state and refuses ZeRO-1 without AdamW.
#include <gtest/gtest.h>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/basic.h"
#include "nxd/trainer/nxd_api.h"
#include "support/ranks.h"

using namespace nxd;
using namespace nxd::trainer;

namespace {
std::string config_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST(NxdApi, DefaultsAndKeysFromJson) {
  const NxDConfig d;
  EXPECT_EQ(d.tensor_parallel_size, 1);
  EXPECT_FALSE(d.optimizer_config.zero_one_enabled);
  EXPECT_TRUE(d.optimizer_config.grad_clipping);
  EXPECT_EQ(d.optimizer_config.max_grad_norm, 1.0);
  const NxDConfig c = NxDConfig::from_json(nlohmann::json::parse(
      R"({"tensor_parallel_size": 2, "sequence_parallel": true,
          "optimizer_config": {"zero_one_enabled": true, "max_grad_norm": 0.5}})"));
  EXPECT_EQ(c.tensor_parallel_size, 2);
  EXPECT_TRUE(c.sequence_parallel);
  EXPECT_TRUE(c.optimizer_config.zero_one_enabled);
  EXPECT_EQ(c.optimizer_config.max_grad_norm, 0.5);
  EXPECT_NE(config_error([] {
              NxDConfig::from_json({{"tensor_parallel", 2}});
            }).find("unknown key 'tensor_parallel'"),
            std::string::npos);
  EXPECT_NE(config_error([] {
              NxDConfig::from_json({{"tensor_parallel_size", "two"}});
            }).find("tensor_parallel_size"),
            std::string::npos);
}

TEST(NxdApi, ConfigChecksTheWorldAndInitializesParallelState) {
  nxd::testing::run_ranks(4, [] {
    NxDConfig three;
    three.tensor_parallel_size = 3;
    EXPECT_NE(config_error([&] {
                neuronx_distributed_config(three);
              }).find("world of 4 rank(s) is not tensor_parallel_size 3"),
              std::string::npos);
    NxDConfig two;
    two.tensor_parallel_size = 2;
    neuronx_distributed_config(two);
    EXPECT_EQ(parallel_state::get_tensor_model_parallel_size(), 2);
    EXPECT_EQ(parallel_state::get_data_parallel_size(), 2);
    neuronx_distributed_config(two);  // again with the same sizes: fine
    NxDConfig four;
    four.tensor_parallel_size = 4;
    EXPECT_NE(config_error([&] { neuronx_distributed_config(four); }).find("already initialized"),
              std::string::npos);
    NxDConfig z = two;
    z.optimizer_config.zero_one_enabled = true;
    Linear lin(4, 4);
    std::vector<optim::NamedParam> ps;
    for (auto& [n, t] : lin.named_parameters()) ps.push_back({n, t});
    EXPECT_NE(config_error([&] {
                initialize_parallel_optimizer(z, lin, optim::default_param_groups(ps, 0.1, 0),
                                              optim::SGDOptions{});
              }).find("shards AdamW's state"),
              std::string::npos);
  });
}

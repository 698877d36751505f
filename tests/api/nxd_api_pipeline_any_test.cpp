// initialize_parallel_model over a PipelineSequential (NxD's NxDPPModel for any module) through
// NxD's API: meta-device init gives every rank's pieces the values of a host build (a tied
// weight materialized under the last stage's piece name included: it is copied from the first
// stage), the optimizer wrapper trains it like one rank, and the calls meant for other models
// are refused by name.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <mutex>

#include "nxd/api/nxd_api.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/runtime/init.h"
#include "pipeline/generic_models.h"
#include "support/compare.h"
#include "support/ranks.h"

using namespace nxd;
using namespace nxd::api;
using nxd::pipeline::Batch;
using nxd::testing::HeadKind;
using nxd::testing::HeadOutputs;
namespace ps = nxd::parallel_state;

namespace {

constexpr int64_t kD = 4, kH = 8, kB = 8;
constexpr uint64_t kSeed = 5;
constexpr int kSteps = 5, kM = 2;

std::shared_ptr<pipeline::PipelineSequential> tied_regressor(const ParamOptions& po) {
  return nxd::testing::regressor(kD, kH, 4, HeadKind::tied, HeadOutputs::prediction, kSeed, po);
}

Batch batch(int step) {
  Tensor x = zeros({kB, kD}), y = zeros({kB, kD});
  init::normal(x, RngStream{3, 10 + static_cast<uint64_t>(step)}, 0.0, 1.0);
  init::normal(y, RngStream{3, 50 + static_cast<uint64_t>(step)}, 0.0, 1.0);
  return {{"x", x}, {"y", y}};
}

pipeline::GenericPipelineOptions options() {
  pipeline::GenericPipelineOptions po;
  po.transformer_layer_cls = "ResBlock";
  po.loss.loss_fn = [](const std::vector<Tensor>& outs, const Batch& mb) {
    return nxd::testing::mse(outs.at(0), mb.at("y"));
  };
  return po;
}

// One rank: SGD over the host-built model, each step accumulating kM microbatches.
std::vector<double> one_rank_losses() {
  auto net = tied_regressor({});
  std::vector<optim::NamedParam> params;
  for (auto& [n, t] : net->named_parameters()) params.push_back({n, t});
  optim::SGD opt({optim::ParamGroup{"all", params, 0.1}});
  std::vector<double> out;
  for (int s = 0; s < kSteps; ++s) {
    const Batch b = batch(s);
    double loss = 0;
    for (int i = 0; i < kM; ++i) {
      Batch mb;
      for (const auto& [k, t] : b) mb[k] = t.narrow(0, i * kB / kM, kB / kM).contiguous();
      Tensor l = mul(nxd::testing::mse(net->forward(mb).at(0), mb.at("y")), 1.0 / kM);
      backward(l);
      loss += l.item();
    }
    out.push_back(loss);
    opt.step();
    net->zero_grad();
  }
  return out;
}

}  // namespace

TEST(NxDApiPipelineAny, MetaInitTiedHeadTrainsLikeOneRank) {
  for (pipeline::ScheduleKind k :
       {pipeline::ScheduleKind::gpipe, pipeline::ScheduleKind::one_f_one_b,
        pipeline::ScheduleKind::interleaved}) {
    std::mutex mu;
    double worst = 0;
    nxd::testing::run_ranks(2, [&] {
      const std::vector<double> ref = one_rank_losses();
      std::map<std::string, Tensor> host;
      for (auto& [n, t] : tied_regressor({})->named_parameters()) host[n] = t.detach().clone();
      NxDConfig want;
      want.pipeline_parallel_size = 2;
      want.pipeline_config.num_microbatches = kM;
      want.pipeline_config.schedule = k;
      want.pipeline_config.virtual_pipeline_size = k == pipeline::ScheduleKind::interleaved ? 2 : 1;
      want.optimizer_config.grad_clipping = false;
      want.model_init_config.meta_device_init = true;
      want.model_init_config.seed = kSeed;
      const NxDConfig cfg = neuronx_distributed_config(want);
      auto model = initialize_parallel_model(cfg, tied_regressor, options());
      ASSERT_TRUE(model->is_pipeline());
      EXPECT_EQ(model->generic_pipeline()->tied(), std::vector<std::string>{"embed.weight"});
      for (const optim::NamedParam& p : model->local_named_parameters())
        EXPECT_TRUE(nxd::testing::bitwise_equal(p.param, host.at(p.name), p.name));
      auto opt = initialize_parallel_optimizer(
          cfg, *model, {optim::ParamGroup{"all", model->local_named_parameters(), 0.1}},
          optim::SGDOptions{});
      for (int s = 0; s < kSteps; ++s) {
        const double l = model->run_train(batch(s)).loss.item();
        EXPECT_NEAR(l, ref[s], 1e-6 * std::abs(ref[s])) << "step " << s;
        {
          std::lock_guard<std::mutex> g(mu);  // not across the collective step
          worst = std::max(worst, std::abs(l - ref[s]) / std::abs(ref[s]));
        }
        opt->step();
        opt->zero_grad();
      }
    });
    std::printf(
        "    [%s] %d SGD steps at pp=2 (tied head, meta init): largest relative loss "
        "difference %.3g\n",
        pipeline::schedule_name(k), kSteps, worst);
  }
}

TEST(NxDApiPipelineAny, CallsForOtherModelsAreRefused) {
  nxd::testing::run_ranks(1, [&] {
    const NxDConfig cfg = neuronx_distributed_config(NxDConfig{});
    auto model = initialize_parallel_model(cfg, tied_regressor, options());
    const Tensor ids = zeros({2, 4}, DType::i64);
    EXPECT_THROW(model->run_train(ids, ids), ConfigError);
    EXPECT_THROW(model->forward(ids), ConfigError);
    EXPECT_THROW(model->run_train([](Module&) { return scalar(0.0); }), ConfigError);
    auto plain = initialize_parallel_model(
        cfg, [](const ParamOptions& po) -> std::shared_ptr<Module> { return tied_regressor(po); });
    try {
      plain->run_train(batch(0));
      ADD_FAILURE() << "run_train(batch) on a plain module";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("needs a model built as a pipeline of pieces"),
                std::string::npos)
          << e.what();
    }
    NxDConfig lora = cfg;
    lora.lora_config = LoraConfig{};
    EXPECT_THROW(initialize_parallel_model(lora, tied_regressor, options()), ConfigError);
  });
}

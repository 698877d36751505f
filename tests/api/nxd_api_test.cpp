// NxD's config and optimizer wrapper (api/nxd_api.h): NxD's keys and defaults, the errors
// for impossible settings, and that the wrapper's step is the Trainer's (its training tests run
// on it) — here: it initializes parallel_state and refuses ZeRO-1 without AdamW.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>

#include "nxd/api/nxd_api.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/basic.h"
#include "nxd/layers/parallel/pad.h"
#include "nxd/optim/elementwise_optimizer.h"
#include "nxd/runtime/rng.h"
#include "support/compare.h"
#include "support/ranks.h"
#include "support/tiny_models.h"

using namespace nxd;
using namespace nxd::api;

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
  // optimizer_config.zero_stage: zero_one_enabled is stage 1; any other stage with it is refused
  EXPECT_EQ(c.optimizer_config.stage(), optim::ZeroStage::one);
  const NxDConfig z2 =
      NxDConfig::from_json(nlohmann::json::parse(R"({"optimizer_config": {"zero_stage": 2}})"));
  EXPECT_EQ(z2.optimizer_config.stage(), optim::ZeroStage::two);
  EXPECT_NE(
      config_error([] {
        NxDConfig::from_json(nlohmann::json::parse(R"({"optimizer_config": {"zero_stage": 4}})"));
      }).find("optimizer_config.zero_stage=4"),
      std::string::npos);
  NxDConfig both = z2;
  both.optimizer_config.zero_one_enabled = true;
  const std::string msg = config_error([&] { neuronx_distributed_config(both); });
  EXPECT_NE(msg.find("optimizer_config.zero_one_enabled=true"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optimizer_config.zero_stage=2"), std::string::npos) << msg;
}

namespace {
// A user's optimizer whose update is not elementwise (each step moves by lr along the gradient
// normalized by its global norm): ZeRO-1 cannot shard it.
class NormalizedSgd : public optim::Optimizer {
 public:
  explicit NormalizedSgd(std::vector<optim::ParamGroup> g)
      : Optimizer(std::move(g), "NormalizedSGD") {}
  void step() override {
    NoGradGuard ng;
    const double norm = optim::grad_norm(optim::params_of(named_parameters()));
    for (const auto& grp : groups_)
      for (const auto& p : grp.params) {
        if (!p.param.grad().defined()) continue;
        const Tensor g = p.param.grad().contiguous();
        float* w = p.param.detach().data<float>();
        const float c = static_cast<float>(grp.lr / (norm + 1e-12));
        for (int64_t i = 0; i < g.numel(); ++i) w[i] -= c * g.data<float>()[i];
      }
  }
};
}  // namespace

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
                initialize_parallel_optimizer(
                    z, lin, optim::default_param_groups(ps, 0.1, 0),
                    [](std::vector<optim::ParamGroup> g) {
                      return std::make_unique<NormalizedSgd>(std::move(g));
                    });
              }).find("got NormalizedSGD, which gives none"),
              std::string::npos);
    // any optimizer with an elementwise rule: NxD's optimizer_class form, here Lion
    auto lion = initialize_parallel_optimizer(z, lin, optim::default_param_groups(ps, 0.1, 0),
                                              [](std::vector<optim::ParamGroup> g) {
                                                return std::make_unique<optim::Lion>(std::move(g));
                                              });
    EXPECT_TRUE(lion->zero1());
    EXPECT_EQ(std::string(lion->inner().kind()), "Lion");
  });
}

namespace {

Tensor batch_ids(int dp_rank, int step, int64_t vocab) {
  return nxd::testing::random_ids(700u + static_cast<uint64_t>(step),
                                  static_cast<uint64_t>(dp_rank), vocab);
}

}  // namespace

TEST(NxdApi, PrecisionResolution) {
  auto of = [](const std::string& p, std::optional<bool> mw = {}, std::optional<bool> acc = {}) {
    NxDConfig c;
    c.precision = p;
    c.mixed_precision_config = {mw, acc};
    return resolve_precision(c);
  };
  EXPECT_EQ(of("fp32").param_dtype, DType::f32);
  EXPECT_EQ(of("fp32").matmul, blas::MatmulPrecision::fp32);
  EXPECT_EQ(of("autocast").matmul, blas::MatmulPrecision::bf16);
  EXPECT_EQ(of("autocast").param_dtype, DType::f32);
  const ResolvedPrecision mp = of("mixed_precision");
  EXPECT_EQ(mp.param_dtype, DType::bf16);
  EXPECT_TRUE(mp.master_weights && mp.fp32_grad_acc && !mp.stochastic_rounding);
  const ResolvedPrecision sr = of("bf16SR");
  EXPECT_TRUE(!sr.master_weights && !sr.fp32_grad_acc && sr.stochastic_rounding);
  EXPECT_FALSE(of("mixed_precision", false).master_weights);  // NxD's knobs override
  EXPECT_TRUE(of("bf16SR", {}, true).fp32_grad_acc);
  EXPECT_FALSE(of("fp32", true, true).master_weights);  // f32 parameters are their own masters
  EXPECT_NE(config_error([&] { of("fp16"); }).find("precision must be fp32, autocast"),
            std::string::npos);
  const NxDConfig j = NxDConfig::from_json(nlohmann::json::parse(
      R"({"precision": "mixed_precision", "mixed_precision_config": {"use_master_weights": false},
          "model_init_config": {"meta_device_init": true, "seed": 7},
          "pipeline_config": {"num_microbatches": 4, "schedule": "gpipe"}})"));
  EXPECT_EQ(j.precision, "mixed_precision");
  EXPECT_EQ(j.mixed_precision_config.use_master_weights, std::optional<bool>(false));
  EXPECT_FALSE(j.mixed_precision_config.use_fp32_grad_acc.has_value());
  EXPECT_TRUE(j.model_init_config.meta_device_init);
  EXPECT_EQ(j.model_init_config.seed, 7u);
  EXPECT_EQ(j.pipeline_config.num_microbatches, 4);
  EXPECT_NE(config_error([] {
              NxDConfig::from_json({{"pipeline_config", {{"microbatches", 2}}}});
            }).find("unknown key 'pipeline_config.microbatches'"),
            std::string::npos);
  EXPECT_NE(config_error([] {
              NxDConfig::from_json({{"pipeline_config", {{"schedule", "zigzag"}}}});
            }).find("schedule must be gpipe, 1f1b or interleaved, got 'zigzag'"),
            std::string::npos);
  EXPECT_NE(config_error([] {
              NxDConfig::from_json({{"pipeline_config", {{"partition", "cost"}}}});
            }).find("partition must be parameters or modeled_cost, got 'cost'"),
            std::string::npos);
}

// Meta-device initialization: a model built on the meta device allocates nothing on the host and,
// materialized shard by shard, holds bitwise the values of the host build, at TP 2.
TEST(NxdApi, MetaInitMaterializesTheHostBuildsValues) {
  nxd::testing::run_ranks(2, [] {
    NxDConfig cfg;
    cfg.tensor_parallel_size = 2;
    cfg.model_init_config.meta_device_init = true;
    cfg = neuronx_distributed_config(cfg);
    const int64_t host_before = current_context().memory().live();
    auto meta = initialize_parallel_model(cfg, nxd::testing::tiny_gqa_llama(4), 21);
    auto host = make_causal_lm(nxd::testing::tiny_gqa_llama(4), 21);
    {
      NoGradGuard ng;  // the wrapper's forward is the model's: the full logits
      const Tensor ids = batch_ids(0, 0, 64);
      EXPECT_BITWISE_EQ(meta->forward(ids), host->forward(ids));
    }
    for (const auto& p : meta->local_named_parameters()) {
      ASSERT_FALSE(p.param.is_meta()) << p.name;
      EXPECT_BITWISE_EQ(p.param.detach(), host->get_parameter(p.name).detach()) << p.name;
    }
    EXPECT_GT(current_context().memory().live(), host_before);
    // a module of the user's own: param_init_fn fills each parameter
    NxDConfig own = cfg;
    own.model_init_config.param_init_fn = [](const std::string& name, const Tensor& t) {
      t.fill_(name == "fc.weight" ? 0.5 : -1.0);
    };
    auto m = initialize_parallel_model(own, [](const ParamOptions& po) {
      EXPECT_EQ(po.device, Device::meta);
      LinearOptions lo;
      lo.param = po;
      auto mod = std::make_shared<Module>();
      mod->register_module("fc", std::make_shared<Linear>(3, 2, lo));
      return mod;
    });
    EXPECT_EQ(m->local_module().get_parameter("fc.weight").at({1, 2}), 0.5);
    EXPECT_EQ(m->local_module().get_parameter("fc.bias").at({0}), -1.0);
  });
}

// A 7B-parameter Llama shape (hidden 4096, 32 layers, ffn 11008, vocab 32000) at TP 8 builds on
// the meta device: every rank's share is counted on the meta device, the host allocates nothing.
TEST(NxdApi, SevenBillionParameterShapeBuildsOnTheMetaDevice) {
  ModelConfig c = ModelConfig::llama2_7b();
  c.device = Device::meta;
  std::vector<int64_t> counts(8), meta(8);
  const int64_t host_before = device_memory(Device::host).live();
  int64_t host_grew = 0;
  const auto t0 = std::chrono::steady_clock::now();
  nxd::testing::run_ranks(8, [&] {
    NxDConfig cfg;
    cfg.tensor_parallel_size = 8;
    neuronx_distributed_config(cfg);
    const int r = current_context().rank();
    auto lm = make_causal_lm(c, 1);
    int64_t n = 0, bytes = 0;
    for (const auto& [name, t] : lm->named_parameters()) {
      EXPECT_TRUE(t.is_meta()) << name;
      n += t.numel();
      bytes += t.nbytes();
    }
    counts[r] = n;
    meta[r] = bytes;
    world().barrier();  // every rank's model exists
    if (r == 0) host_grew = device_memory(Device::host).live() - host_before;
    world().barrier();
  });
  std::printf("    7B shape at TP 8 on the meta device: %.2f s for 8 ranks\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const int64_t whole = 6738415616;  // Llama-2-7B's parameters
  const int64_t norms = 65 * 4096;   // two RMSNorms per layer and the final one: on every rank
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(counts[r], (whole - norms) / 8 + norms) << "rank " << r;
    EXPECT_EQ(meta[r], counts[r] * 4) << "rank " << r;
  }
  EXPECT_LT(host_grew, int64_t{64} << 20) << "host bytes allocated while building on meta";
}

namespace {

struct Trace {
  std::vector<double> losses, norms;
  std::map<std::string, Tensor> params;  // after the last step (rank 0 of each stage)
};

// 6 steps of AdamW through initialize_parallel_model / initialize_parallel_optimizer on `world`
// ranks; the global batch is the DP ranks' batches of batch_ids (4 rows each).
Trace train_with_wrappers(int world, NxDConfig want, int dp) {
  Trace t;
  std::mutex mu;
  nxd::testing::run_ranks(world, [&] {
    const NxDConfig cfg = neuronx_distributed_config(want);
    auto model = initialize_parallel_model(cfg, nxd::testing::tiny_gqa_llama(4), 3);
    auto opt = initialize_parallel_optimizer(
        cfg, *model, optim::default_param_groups(model->local_named_parameters(), 1e-3, 0.1),
        optim::AdamWOptions{});
    const int d = parallel_state::get_data_parallel_rank();
    for (int step = 0; step < 6; ++step) {
      std::vector<Tensor> ids, tg;
      // one rank holds the whole global batch; a DP rank its share
      for (int q = dp == 1 ? 0 : d; q < (dp == 1 ? 2 : d + 1); ++q) {
        ids.push_back(batch_ids(q, step, 64));
        tg.push_back(batch_ids(q, 100 + step, 64));
      }
      const double loss = model->run_train(cat_raw(ids, 0), cat_raw(tg, 0)).item();
      opt->step();
      opt->zero_grad();
      if (current_context().rank() == 0) {
        t.losses.push_back(loss);
        t.norms.push_back(opt->grad_norm().value());
      }
    }
    if (parallel_state::get_data_parallel_rank() == 0 &&
        parallel_state::get_tensor_model_parallel_rank() == 0) {
      std::lock_guard<std::mutex> l(mu);
      for (const auto& p : model->local_named_parameters())
        t.params[p.name] = p.param.detach().clone();
    }
  });
  return t;
}

}  // namespace

// PP2 x DP2 with ZeRO-1 through NxD's wrappers (the pipeline's run_train, the ZeRO-1
// reduce-scatter of the optimizer wrapper's buckets) against one rank: every loss and gradient
// norm within 1e-5. Parameters after 6 AdamW steps within 1e-3: AdamW divides by sqrt(v), so an
// element whose gradient nearly cancels between the microbatches moves by up to lr when its
// last-bit rounding differs (the pipeline sums two microbatch gradients, one rank one batch).
TEST(NxdApi, PipelineAndZero1ThroughTheWrappersMatchOneRank) {
  const Trace one = train_with_wrappers(1, NxDConfig{}, 1);
  NxDConfig pp;
  pp.pipeline_parallel_size = 2;
  pp.pipeline_config.num_microbatches = 2;
  pp.optimizer_config.zero_one_enabled = true;
  const Trace par = train_with_wrappers(4, pp, 2);
  ASSERT_EQ(par.losses.size(), one.losses.size());
  double worst = 0, worst_norm = 0;
  for (size_t i = 0; i < one.losses.size(); ++i) {
    worst = std::max(worst, std::abs(par.losses[i] - one.losses[i]) / std::abs(one.losses[i]));
    worst_norm = std::max(worst_norm, std::abs(par.norms[i] - one.norms[i]) / one.norms[i]);
  }
  std::printf(
      "    PP2 x DP2 + ZeRO-1 vs one rank: largest relative loss difference %.3g, "
      "grad norm %.3g\n",
      worst, worst_norm);
  EXPECT_LE(worst, 1e-5);
  EXPECT_LE(worst_norm, 1e-5);
  ASSERT_EQ(par.params.size(), one.params.size());
  for (const auto& [name, t] : one.params)
    EXPECT_TRUE(nxd::testing::close_rel(par.params.at(name), t, 1e-3, name));
}

// mixed_precision through the wrappers: bf16 parameters, f32 gradients (accumulated in the
// optimizer's buckets) and f32 master weights whose rounding the parameters are, at TP2 x DP2.
TEST(NxdApi, MixedPrecisionKeepsF32MastersOfBf16Parameters) {
  nxd::testing::run_ranks(4, [] {
    NxDConfig want;
    want.tensor_parallel_size = 2;
    want.precision = "mixed_precision";
    const NxDConfig cfg = neuronx_distributed_config(want);
    auto model = initialize_parallel_model(cfg, nxd::testing::tiny_gqa_llama(4), 3);
    EXPECT_EQ(model->dtype(), DType::bf16);
    auto opt = initialize_parallel_optimizer(
        cfg, *model, optim::default_param_groups(model->local_named_parameters(), 1e-2, 0.1),
        optim::AdamWOptions{});
    const int d = parallel_state::get_data_parallel_rank();
    for (int step = 0; step < 3; ++step) {
      const Tensor loss = model->run_train(batch_ids(d, step, 64), batch_ids(d, 100 + step, 64));
      EXPECT_EQ(loss.dtype(), DType::f32);
      for (const auto& p : model->local_named_parameters())
        EXPECT_EQ(p.param.grad().dtype(), DType::f32) << p.name;
      opt->step();
      opt->zero_grad();
    }
    for (const auto& p : model->local_named_parameters()) {
      ASSERT_EQ(p.param.dtype(), DType::bf16) << p.name;
      const Tensor m = opt->inner().master(p);
      ASSERT_TRUE(m.defined()) << p.name;
      EXPECT_BITWISE_EQ(p.param.detach(), m.to(DType::bf16)) << p.name;
    }
  });
}

namespace {

// Losses of 5 AdamW steps of `m` (one rank, every parameter in one group).
std::vector<double> adamw_losses(CausalLM& m, int vocab) {
  std::vector<optim::NamedParam> ps;
  for (auto& [n, t] : m.named_parameters()) ps.push_back({n, t});
  optim::AdamW opt({optim::ParamGroup{"all", ps, 1e-2, 0.0}});
  std::vector<double> out;
  for (int step = 0; step < 5; ++step) {
    Tensor loss = m.loss(batch_ids(0, step, vocab), batch_ids(0, 100 + step, vocab));
    backward(loss);
    opt.step();
    opt.zero_grad(true);
    out.push_back(loss.item());
  }
  return out;
}

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double tol,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(std::abs(a[i] - b[i]), tol * std::abs(b[i])) << what << ", step " << i;
}

}  // namespace

// pad_model: 6 heads (multi-head, and grouped 6/2) at TP 4 are padded to 8. On one rank the padded
// model loaded with an unpadded model's weights trains as it does (padded heads stay inert,
// grouped-query's padded output columns masked); at TP 4 initialize_parallel_model builds the
// padded model whose shards are the one-rank padded model's, and trains like it.
TEST(NxdApi, PadModelTrainsAsTheUnpaddedModel) {
  for (int64_t kv : {6, 2}) {
    SCOPED_TRACE("kv heads " + std::to_string(kv));
    ModelConfig base = nxd::testing::tiny_gqa_llama(4);
    base.hidden_size = 48;
    base.num_attention_heads = 6;
    base.num_kv_heads = kv;
    HeadPadding plan;
    const ModelConfig padded = pad_model_config(base, 4, &plan);
    ASSERT_TRUE(plan.needed());
    EXPECT_EQ(padded.num_attention_heads, 8);
    EXPECT_EQ(padded.head_dim(), 8);
    std::vector<double> unpadded, padded_one, padded_tp4;
    nxd::testing::run_ranks(1, [&] {
      auto u = make_causal_lm(base, 9);
      auto p = make_causal_lm(padded, 9);
      p->load_state_dict(pad_model(*u, 4));  // the unpadded weights, zero padded heads
      EXPECT_EQ(zero_padded_heads(*p, plan), 4);
      unpadded = adamw_losses(*u, 64);
      const std::vector<double> loaded = adamw_losses(*p, 64);
      expect_close(loaded, unpadded, 1e-6, "padded model loaded with the unpadded weights");
      auto fresh = make_causal_lm(padded, 9);
      zero_padded_heads(*fresh, plan);
      padded_one = adamw_losses(*fresh, 64);
    });
    nxd::testing::run_ranks(4, [&] {
      NxDConfig want;
      want.tensor_parallel_size = 4;
      want.pad_model = true;
      want.optimizer_config.grad_clipping = false;  // as the one-rank AdamW
      const NxDConfig cfg = neuronx_distributed_config(want);
      auto model = initialize_parallel_model(cfg, base, 9);
      auto& lm = dynamic_cast<CausalLM&>(model->local_module());
      EXPECT_EQ(lm.config().num_attention_heads, 8);
      auto opt = initialize_parallel_optimizer(
          cfg, *model, {optim::ParamGroup{"all", model->local_named_parameters(), 1e-2, 0.0}},
          optim::AdamWOptions{});
      std::vector<double> mine;
      for (int step = 0; step < 5; ++step) {
        mine.push_back(
            model->run_train(batch_ids(0, step, 64), batch_ids(0, 100 + step, 64)).item());
        opt->step();
        opt->zero_grad();
      }
      if (current_context().rank() == 0) padded_tp4 = mine;
    });
    expect_close(padded_tp4, padded_one, 1e-5, "TP 4 padded against one rank padded");
  }
  // a module of the user's own is padded by hand
  EXPECT_NE(config_error([] {
              NxDConfig c;
              c.pad_model = true;
              initialize_parallel_model(
                  c, [](const ParamOptions&) { return std::make_shared<Module>(); });
            }).find("pad_model pads decoder models"),
            std::string::npos);
}

// A user's own model classes through NxD's API: activation checkpointing of every instance of a
// class (NxDConfig::activation_checkpoint_classes, layers/activation_checkpoint.h) against the
// plain model (bitwise gradients, a lower allocator peak), and NxD's pad_model(model, tp_degree,
// n_heads, wrapped_classes, pad_hook_fn) on a user's attention class: 6 heads padded to 8 at TP 4
// train as the unpadded one-rank model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>

#include "nxd/api/nxd_api.h"
#include "nxd/autograd/ops.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/activation_checkpoint.h"
#include "nxd/layers/basic.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/parallel/pad.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/rng.h"
#include "support/compare.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/ranks.h"

using namespace nxd;
using namespace nxd::api;

namespace {

Tensor data(const Shape& s, uint64_t seed) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  const RngStream r{seed, 11};
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(2 * r.uniform_f64(i) - 1);
  return from_vector<float>(v, s);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.detach().to_vector();
  const std::vector<double> y = b.detach().to_vector();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// ---- activation checkpointing ----

// A residual MLP block of the user's own; its forward body runs through checkpointed_forward.
class MyBlock : public Module {
 public:
  MyBlock(int64_t d, int64_t ffn, bool wide) : Module("MyBlock"), wide_(wide) {
    up_ = register_module("up", std::make_shared<Linear>(d, ffn));
    down_ = register_module("down", std::make_shared<Linear>(ffn, d));
    drop_ = register_module("drop", std::make_shared<Dropout>(0.1));
  }
  bool wide() const { return wide_; }
  Tensor forward(const Tensor& x) const {
    return checkpointed_forward(*this, x, [this](const Tensor& h) {
      return add(h, drop_->forward(down_->forward(gelu(up_->forward(h)))));
    });
  }

 private:
  bool wide_;
  std::shared_ptr<Linear> up_, down_;
  std::shared_ptr<Dropout> drop_;
};

// A class whose forward does not run through checkpointed_forward.
class PlainScale : public Module {
 public:
  explicit PlainScale(int64_t d) : Module("PlainScale") {
    w_ = register_parameter("weight", zeros({d}), ParamInit::uniform(0.5, 1.5));
  }
  Tensor forward(const Tensor& x) const { return mul(x, w_); }

 private:
  Tensor w_;
};

class NotInModel : public Module {};

class BlockNet : public Module {
 public:
  BlockNet() : Module("BlockNet") {
    blocks_ = register_module("blocks", std::make_shared<ModuleList>());
    for (int i = 0; i < 4; ++i) blocks_->push_back(std::make_shared<MyBlock>(64, 512, i % 2 == 1));
    scale_ = register_module("scale", std::make_shared<PlainScale>(64));
  }
  Tensor loss(const Tensor& x) const {
    Tensor h = x;
    for (const auto& b : *blocks_) h = static_cast<const MyBlock&>(*b).forward(h);
    return mean(square(scale_->forward(h)));
  }

 private:
  std::shared_ptr<ModuleList> blocks_;
  std::shared_ptr<PlainScale> scale_;
};

struct AcRun {
  Tensor loss;
  std::map<std::string, Tensor> grads;
  int64_t peak = 0;  // allocator peak over forward + backward above the bytes live before
};

AcRun train_block_net(const std::vector<ModuleClass>& classes) {
  AcRun r;
  nxd::testing::run_ranks(1, [&] {
    NxDConfig want;
    want.activation_checkpoint_classes = classes;
    const NxDConfig cfg = neuronx_distributed_config(want);
    auto model = initialize_parallel_model(cfg, [](const ParamOptions&) {
      auto m = std::make_shared<BlockNet>();
      m->init_parameters(5);
      return m;
    });
    const Tensor x = data({4, 128, 64}, 1);
    MemoryCounter& mem = current_context().memory();
    mem.reset_peak();
    const int64_t before = mem.live();
    const Tensor l =
        model->run_train([&](Module& m) { return static_cast<const BlockNet&>(m).loss(x); });
    r.peak = mem.peak() - before;
    r.loss = l.detach().clone();
    for (auto& [n, t] : model->local_module().named_parameters()) r.grads[n] = t.grad().clone();
  });
  return r;
}

}  // namespace

// Every MyBlock (a type), or the wide ones (a predicate): the gradients are bitwise the plain
// model's (dropout on: the recomputation replays the RNG) and the activation peak falls.
TEST(UserClasses, ActivationCheckpointOfAClassGivesBitwiseGradientsAndALowerPeak) {
  const AcRun plain = train_block_net({});
  const AcRun every = train_block_net({ModuleClass::of<MyBlock>()});
  const AcRun wide = train_block_net({ModuleClass::where("wide MyBlock", [](const Module& m) {
    const auto* b = dynamic_cast<const MyBlock*>(&m);
    return b && b->wide();
  })});
  for (const AcRun* r : {&every, &wide}) {
    EXPECT_TRUE(nxd::testing::bitwise_equal(r->loss, plain.loss, "loss"));
    for (const auto& [n, g] : plain.grads)
      EXPECT_TRUE(nxd::testing::bitwise_equal(r->grads.at(n), g, n));
  }
  EXPECT_LT(every.peak, wide.peak);
  EXPECT_LT(wide.peak, plain.peak);
  std::printf(
      "    activation peak: plain %.1f KiB, wide MyBlocks recomputed %.1f KiB, every MyBlock "
      "%.1f KiB\n",
      plain.peak / 1024.0, wide.peak / 1024.0, every.peak / 1024.0);
}

TEST(UserClasses, ActivationCheckpointRefusesAClassNotInTheModelOrNotRecomputing) {
  const std::string absent =
      nxd::testing::user_error_message([] { train_block_net({ModuleClass::of<NotInModel>()}); });
  EXPECT_NE(absent.find("no module of class (anonymous namespace)::NotInModel in the model (its "
                        "classes: BlockNet, ModuleList, MyBlock"),
            std::string::npos)
      << absent;
  const std::string plain =
      nxd::testing::user_error_message([] { train_block_net({ModuleClass::named("PlainScale")}); });
  EXPECT_NE(plain.find("class PlainScale (e.g. scale) ran its forward without "
                       "checkpointed_forward"),
            std::string::npos)
      << plain;
  // "full" / "selective" stay the decoder models' granularities
  const std::string full = nxd::testing::user_error_message([] {
    nxd::testing::run_ranks(1, [] {
      NxDConfig c;
      c.activation_checkpoint_config = "full";
      initialize_parallel_model(neuronx_distributed_config(c),
                                [](const ParamOptions&) { return std::make_shared<BlockNet>(); });
    });
  });
  EXPECT_NE(full.find("activation_checkpoint_classes"), std::string::npos) << full;
}

// ---- pad_model on a user's attention class ----
namespace {

// Multi-head causal attention of the user's own from NxD's parallel layers, with a per-head gain
// of its own (sharded with the heads) that its pad hook resizes.
class MyAttention : public ParallelModule {
 public:
  MyAttention(int64_t hidden, int64_t heads, int64_t head_dim)
      : ParallelModule("MyAttention"), d_(head_dim) {
    const int tp = parallel_state::get_tensor_model_parallel_size();
    NXD_CHECK(heads % tp == 0, "[MyAttention] ", heads, " heads over TP ", tp);
    local_heads_ = heads / tp;
    const ColumnParallelLinearOptions co{.gather_output = false};
    for (const char* n : {"q_proj", "k_proj", "v_proj"})
      qkv_.push_back(
          register_module(n, std::make_shared<ColumnParallelLinear>(hidden, heads * d_, co)));
    o_ = register_module(
        "o_proj", std::make_shared<RowParallelLinear>(
                      heads * d_, hidden, RowParallelLinearOptions{.input_is_parallel = true}));
    const int64_t rank = parallel_state::get_tensor_model_parallel_rank();
    gain_ = register_parameter(
        "head_gain", zeros({local_heads_}),
        tp_detail::with_region(ParamInit::uniform(0.5, 1.5), {heads}, {rank * local_heads_}));
    set_parallel_attrs(
        "head_gain",
        ParallelAttrs{.tensor_model_parallel = true, .partition_dim = 0, .num_partitions = tp});
  }
  Tensor forward(const Tensor& x) const {
    const int64_t B = x.size(0), S = x.size(1);
    auto heads = [&](const Tensor& t) {
      return transpose(reshape(t, {B, S, local_heads_, d_}), 1, 2);
    };
    Tensor o = scaled_dot_product_attention(heads(qkv_[0]->forward(x)), heads(qkv_[1]->forward(x)),
                                            heads(qkv_[2]->forward(x)));
    o = mul(o, reshape(gain_, {1, local_heads_, 1, 1}));
    return o_->forward(reshape(transpose(o, 1, 2), {B, S, local_heads_ * d_}));
  }

 private:
  int64_t d_, local_heads_;
  std::vector<std::shared_ptr<ColumnParallelLinear>> qkv_;
  std::shared_ptr<RowParallelLinear> o_;
  Tensor gain_;
};

class AttnNet : public Module {
 public:
  explicit AttnNet(int64_t heads) : Module("AttnNet") {
    for (int l = 0; l < 2; ++l) {
      const std::string s = std::to_string(l);
      attn_.push_back(register_module("attn" + s, std::make_shared<MyAttention>(48, heads, 8)));
      up_.push_back(register_module(
          "up" + s, std::make_shared<ColumnParallelLinear>(
                        48, 64, ColumnParallelLinearOptions{.gather_output = false})));
      down_.push_back(register_module(
          "down" + s, std::make_shared<RowParallelLinear>(
                          64, 48, RowParallelLinearOptions{.input_is_parallel = true})));
    }
  }
  Tensor loss(const Tensor& x) const {
    Tensor h = x;
    for (size_t l = 0; l < attn_.size(); ++l) {
      h = add(h, attn_[l]->forward(h));
      h = add(h, down_[l]->forward(gelu(up_[l]->forward(h))));
    }
    return mean(square(h));
  }

 private:
  std::vector<std::shared_ptr<MyAttention>> attn_;
  std::vector<std::shared_ptr<ColumnParallelLinear>> up_;
  std::vector<std::shared_ptr<RowParallelLinear>> down_;
};

std::vector<std::string> hooked;  // the pad hook's MyAttention instances (one rank)

// The user's pad hook: the gain of padded heads is zero.
void pad_gain(const PadHookArgs& a) {
  if (!dynamic_cast<MyAttention*>(&a.module)) return;
  hooked.push_back(a.name + " " + std::to_string(a.tgt_src_ratio));
  const std::string key = a.name + ".head_gain";
  const Tensor g = a.state.at(key);
  const int64_t padded = std::llround(static_cast<double>(g.size(0)) * a.tgt_src_ratio);
  Tensor out = zeros({padded});
  out.narrow(0, 0, g.size(0)).copy_(g.detach());
  a.state.set(key, out);
}

std::map<std::string, Tensor> full_map(const StateDict& s) {
  std::map<std::string, Tensor> m;
  for (const auto& [k, t] : s) m[k] = t.detach().clone();
  return m;
}

const std::vector<ModuleClass> kWrapped = {ModuleClass::of<MyAttention>()};

std::shared_ptr<NxDModel> attn_model(const NxDConfig& cfg, int64_t heads) {
  return initialize_parallel_model(cfg, [heads](const ParamOptions&) {
    auto m = std::make_shared<AttnNet>(heads);
    m->init_parameters(7);
    return m;
  });
}

std::unique_ptr<NxDOptimizer> adamw(const NxDConfig& cfg, NxDModel& model) {
  return initialize_parallel_optimizer(
      cfg, model, {optim::ParamGroup{"all", model.local_named_parameters(), 1e-2, 0.0}},
      optim::AdamWOptions{});
}

double attn_step(NxDModel& model, int step) {
  const Tensor x = data({2, 16, 48}, 20 + static_cast<uint64_t>(step));
  const double l =
      model.run_train([&](Module& m) { return static_cast<const AttnNet&>(m).loss(x); }).item();
  return l;
}

}  // namespace

TEST(UserClasses, PadModelOfAUserAttentionAtTp4TrainsAsTheUnpaddedOneRankModel) {
  constexpr int kSteps = 4;
  std::vector<double> ref_losses;
  std::map<std::string, Tensor> padded_state, padded_grads;
  hooked.clear();
  nxd::testing::run_ranks(1, [&] {
    NxDConfig want;
    want.optimizer_config.grad_clipping = false;
    const NxDConfig cfg = neuronx_distributed_config(want);
    auto model = attn_model(cfg, 6);
    padded_state = full_map(pad_model(model->local_module(), 4, 6, kWrapped, pad_gain));
    auto opt = adamw(cfg, *model);
    for (int step = 0; step < kSteps; ++step) {
      ref_losses.push_back(attn_step(*model, step));
      if (step == 0) {  // the gradients, padded the same way
        AttnNet g(6);
        StateDict grads;
        for (auto& [n, t] : model->local_module().named_parameters()) grads.insert(n, t.grad());
        g.load_state_dict(grads);
        padded_grads = full_map(pad_model(g, 4, 6, kWrapped, pad_gain));
      }
      opt->step();
      opt->zero_grad();
    }
  });
  // NxD's order: children first, every module inside a wrapped instance gets the hook
  ASSERT_EQ(hooked.size(), 4u);
  EXPECT_EQ(hooked[0], "attn0 " + std::to_string(8.0 / 6.0));
  EXPECT_EQ(padded_state.at("attn0.q_proj.weight").shape(), (Shape{64, 48}));
  EXPECT_EQ(padded_state.at("attn0.o_proj.weight").shape(), (Shape{48, 64}));
  EXPECT_EQ(padded_state.at("up0.weight").shape(), (Shape{64, 48}));  // not wrapped: as it was

  std::vector<double> tp_losses;
  double worst_grad = 0;
  std::string sharded;
  std::mutex mu;
  nxd::testing::run_ranks(4, [&] {
    NxDConfig want;
    want.tensor_parallel_size = 4;
    want.optimizer_config.grad_clipping = false;
    const NxDConfig cfg = neuronx_distributed_config(want);
    auto model = attn_model(cfg, 8);
    ckpt::load_full_tensors({&model->local_module()}, padded_state, "padded state");
    auto opt = adamw(cfg, *model);
    std::vector<double> mine;
    for (int step = 0; step < kSteps; ++step) {
      mine.push_back(attn_step(*model, step));
      if (step == 0) {
        AttnNet want_grads(8);
        ckpt::load_full_tensors({&want_grads}, padded_grads, "padded gradients");
        double worst = 0;
        for (auto& [n, t] : model->local_module().named_parameters())
          worst = std::max(worst, max_abs_diff(t.grad(), want_grads.get_parameter(n)));
        const std::lock_guard<std::mutex> lock(mu);
        worst_grad = std::max(worst_grad, worst);
      }
      opt->step();
      opt->zero_grad();
    }
    const std::string e =
        nxd::testing::user_error_message([&] { pad_model(model->local_module(), 4, 6, kWrapped); });
    if (current_context().rank() == 0) {
      tp_losses = mine;
      sharded = e;
    }
  });
  const double worst_loss = nxd::testing::worst_rel(tp_losses, ref_losses);
  std::printf(
      "    TP 4 padded 6 -> 8 heads vs one rank unpadded: losses rel %.3g, step-0 "
      "gradients abs %.3g\n",
      worst_loss, worst_grad);
  EXPECT_LT(worst_loss, 1e-6);
  EXPECT_LT(worst_grad, 1e-6);
  EXPECT_NE(sharded.find("'attn0.q_proj' is sharded over 4 ranks"), std::string::npos) << sharded;
}

TEST(UserClasses, PadModelRefusesAWrappedClassNotInTheModel) {
  nxd::testing::run_ranks(1, [] {
    neuronx_distributed_config({});
    AttnNet net(6);
    const std::string e = nxd::testing::user_error_message(
        [&] { pad_model(net, 4, 6, {ModuleClass::of<NotInModel>()}); });
    EXPECT_NE(e.find("[pad_model] no module of class (anonymous namespace)::NotInModel"),
              std::string::npos)
        << e;
  });
}

// NxD's model.config and name_or_path shortcuts: a decoder model's ModelConfig, read from a
// transformers folder's config.json (the architecture without weights), and where it came from.
TEST(UserClasses, ModelConfigAndNameOrPathShortcuts) {
  const nxd::testing::ScratchDir dir("nxd_user_classes_");
  const nlohmann::json j = {{"model_type", "llama"},       {"vocab_size", 64},
                            {"hidden_size", 32},           {"intermediate_size", 48},
                            {"num_hidden_layers", 2},      {"num_attention_heads", 4},
                            {"num_key_value_heads", 2},    {"max_position_embeddings", 64},
                            {"rms_norm_eps", 1e-6},        {"hidden_act", "silu"},
                            {"tie_word_embeddings", false}};
  std::ofstream(dir.path / "config.json") << j.dump();
  const ModelConfig mc = ckpt::read_hf_config(dir.path);
  EXPECT_EQ(mc.name_or_path, dir.path.string());
  nxd::testing::run_ranks(2, [&] {
    NxDConfig want;
    want.tensor_parallel_size = 2;
    const NxDConfig cfg = neuronx_distributed_config(want);
    auto lm = initialize_parallel_model(cfg, mc, 3);
    EXPECT_EQ(lm->model_config().hidden_size, 32);
    EXPECT_EQ(lm->model_config().num_kv_heads, 2);
    EXPECT_EQ(lm->name_or_path(), dir.path.string());
    // a module of the user's own has no ModelConfig
    auto own = attn_model(cfg, 8);
    const std::string e = nxd::testing::user_error_message([&] { own->model_config(); });
    EXPECT_NE(e.find("[NxDModel] model_config: the model is AttnNet, not a decoder model"),
              std::string::npos)
        << e;
  });
}

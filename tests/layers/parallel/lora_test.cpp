// LoRA adapters on the parallel linear layers (layers/parallel/lora.h): a gradcheck in f64 of the
// LoRA linear; column -> row chains and GQA q/k/v (K/V replicated at TP 4) at TP 2 and 4, SP on
// and off, against the same layers on one rank (outputs, input and adapter gradients); the base
// weights get no gradient; merging the adapter into the weight gives the adapted output.
#include <gtest/gtest.h>

#include <functional>

#include "nxd/autograd/function.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/parallel/lora.h"
#include "nxd/layers/parallel/qkv.h"
#include "support/lora.h"
#include "tp_util.h"

using namespace nxd;
using namespace nxd::testing;

namespace {

constexpr int64_t B = 2, S = 4, HID = 8, FFN = 16, R = 4;
constexpr uint64_t kSeed = 11;
constexpr double kTol = 1e-5;

void check_grad(const autograd::ForwardFn& fn, const std::vector<Tensor>& in,
                const std::string& what) {
  auto r = autograd::gradcheck(fn, in);
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

LoraConfig lora_cfg(std::vector<std::string> targets, double dropout = 0.0) {
  LoraConfig c;
  c.lora_rank = R;
  c.lora_alpha = 8;
  c.lora_dropout = dropout;
  c.target_modules = std::move(targets);
  return c;
}

struct Chain : Module {
  std::shared_ptr<ColumnParallelLinear> up;
  std::shared_ptr<RowParallelLinear> down;
  Chain(bool sp, std::shared_ptr<Communicator> g) {
    ColumnParallelLinearOptions co;
    co.gather_output = false;
    co.sequence_parallel_enabled = sp;
    co.group = g;
    RowParallelLinearOptions ro;
    ro.input_is_parallel = true;
    ro.sequence_parallel_enabled = sp;
    ro.group = g;
    up = register_module("up_proj", std::make_shared<ColumnParallelLinear>(HID, FFN, co));
    down = register_module("down_proj", std::make_shared<RowParallelLinear>(FFN, HID, ro));
  }
  Tensor forward(const Tensor& x) const { return down->forward(gelu(up->forward(x))); }
};

// The full (one-rank layout) gradient of a parameter from this rank's shard.
Tensor full_grad(Communicator& g, Module& m, const std::string& name) {
  Tensor gr = m.get_parameter(name).grad();
  const ParallelParameter* pp = nullptr;
  auto all = parallel_parameters(m);
  for (const auto& p : all)
    if (p.name == name) pp = &p;
  if (!pp->attrs.tensor_model_parallel) return gr;
  return gathered(g, gr, pp->attrs.partition_dim);
}

void run_chain(int tp, bool sp) {
  run_tp(tp, [&](Communicator& g) {
    const int r = g.rank();
    Chain one(false, make_self_communicator(r));
    Chain par(sp, nullptr);
    for (Chain* c : {&one, &par}) {
      c->init_parameters(kSeed);
      apply_lora(*c, lora_cfg({"up_proj", "down_proj"}), kSeed);
      randomize_lora_b(*c);
    }
    Tensor xf = randn({B, S, HID}, 1), dir = randn({B, S, HID}, 2);
    Tensor x1 = leaf(xf), xp = leaf(sp ? chunk_of(xf, 1, r, tp) : xf);
    Tensor y1 = one.forward(x1);
    backward(sum(mul(y1, dir)));
    Tensor yp = par.forward(xp);
    backward(sum(mul(yp, sp ? chunk_of(dir, 1, r, tp) : dir)));
    if (sp) allreduce_sequence_parallel_gradients(par);
    check_close(sp ? gathered(g, yp, 1) : yp, y1, kTol, "output");
    check_close(sp ? gathered(g, xp.grad(), 1) : xp.grad(), x1.grad(), kTol, "dx");
    for (const auto& [name, t] : lora_parameters(one)) {
      ASSERT_TRUE(t.grad().defined()) << name;
      check_close(full_grad(g, par, name), t.grad(), kTol, name);
    }
    for (Chain* c : {&one, &par})
      for (const auto& [name, t] : c->named_parameters()) {
        if (is_lora_name(name)) continue;
        EXPECT_FALSE(t.requires_grad()) << name;
        EXPECT_FALSE(t.grad().defined()) << name << " is frozen but got a gradient";
      }
  });
}

}  // namespace

TEST(Lora, ColumnRowChainTp2MatchesOneRank) {
  run_chain(2, false);
}
TEST(Lora, ColumnRowChainTp4MatchesOneRank) {
  run_chain(4, false);
}
TEST(Lora, ColumnRowChainSequenceParallelTp2MatchesOneRank) {
  run_chain(2, true);
}
TEST(Lora, ColumnRowChainSequenceParallelTp4MatchesOneRank) {
  run_chain(4, true);
}

namespace {

constexpr int64_t H = 4, HKV = 2, D = 4;  // q 16, kv 8 features of a hidden 8

struct Qkv : Module {
  std::shared_ptr<GQAQKVColumnParallelLinear> qkv;
  Qkv(bool sp, int64_t m, std::shared_ptr<Communicator> g) {
    GQAQKVColumnParallelLinearOptions o;
    o.sequence_parallel_enabled = sp;
    o.gather_output = !sp;
    o.kv_size_multiplier = m;
    o.head_dim = D;
    o.group = g;
    qkv = std::make_shared<GQAQKVColumnParallelLinear>(HID, H * D, HKV * D, o);
    register_module("q_proj", qkv->q_proj());
    register_module("k_proj", qkv->k_proj());
    register_module("v_proj", qkv->v_proj());
  }
};

// q, k, v projected on tp ranks (K/V replicated m = tp / 2 times at TP 4) against one rank. Without
// SP the outputs are gathered (and de-replicated) so the loss is the one-rank loss on every rank;
// with SP each rank's local heads enter the loss once per logical head (replicas weighted 1/m).
void run_qkv(int tp, bool sp) {
  const int64_t m = std::max<int64_t>(1, tp / HKV);
  run_tp(tp, [&](Communicator& g) {
    const int r = g.rank();
    Qkv one(false, 1, make_self_communicator(r));
    Qkv par(sp, m, nullptr);
    for (Qkv* c : {&one, &par}) {
      c->init_parameters(kSeed);
      apply_lora(*c, lora_cfg({"qkv_proj"}), kSeed);
      randomize_lora_b(*c);
    }
    Tensor xf = randn({B, S, HID}, 3);
    std::array<Tensor, 3> ups = {randn({B, S, H * D}, 4), randn({B, S, HKV * D}, 5),
                                 randn({B, S, HKV * D}, 6)};
    Tensor x1 = leaf(xf), xp = leaf(sp ? chunk_of(xf, 1, r, tp) : xf);
    auto o1 = one.qkv->forward(x1);
    backward(add(add(sum(mul(o1[0], ups[0])), sum(mul(o1[1], ups[1]))), sum(mul(o1[2], ups[2]))));
    auto op = par.qkv->forward(xp);
    Tensor loss;
    if (!sp) {
      loss = add(add(sum(mul(op[0], ups[0])), sum(mul(op[1], ups[1]))), sum(mul(op[2], ups[2])));
    } else {  // local heads: q rows [r*16/tp ..), k/v block r/m of the kv rows, weighted 1/m
      const int64_t qp = H * D / tp, kp = HKV * D * m / tp, blk = r / m;
      loss = sum(mul(op[0], ups[0].narrow(2, r * qp, qp)));
      for (int i = 1; i < 3; ++i)
        loss = add(loss, mul(sum(mul(op[i], ups[i].narrow(2, blk * kp, kp))), 1.0 / double(m)));
    }
    backward(loss);
    if (sp) allreduce_sequence_parallel_gradients(par);
    if (!sp)
      for (int i = 0; i < 3; ++i) check_close(op[i], o1[i], kTol, "output");
    check_close(sp ? gathered(g, xp.grad(), 1) : xp.grad(), x1.grad(), kTol, "dx");
    for (const auto& [name, t] : lora_parameters(one)) {
      Tensor gp = par.get_parameter(name).grad();
      ASSERT_TRUE(gp.defined()) << name;
      if (name.find("lora_A") != std::string::npos) {
        check_close(gp, t.grad(), kTol, name);  // replicated
      } else {  // this rank's rows of B (a K/V replica's block: the replicas' summed gradient)
        const bool q = name.rfind("q_proj", 0) == 0;
        const int64_t rows = gp.size(0), start = q ? r * rows : (r / m) * rows;
        check_close(gp, t.grad().narrow(0, start, rows), kTol, name);
      }
    }
  });
}

}  // namespace

TEST(Lora, GqaQkvTp2MatchesOneRank) {
  run_qkv(2, false);
}
TEST(Lora, GqaQkvReplicatedKvTp4MatchesOneRank) {
  run_qkv(4, false);
}
TEST(Lora, GqaQkvSequenceParallelTp4MatchesOneRank) {
  run_qkv(4, true);
}

// The LoRA linear y = x W^T + b + scale * (dropout(x) A^T) B^T in f64 against central differences:
// through the layer for x (dropout off and on: the mask is drawn once per forward, so the fn uses
// a fixed stream), and for W, b, A, B with the same ops the adapter runs.
TEST(Lora, GradcheckF64) {
  run_tp(1, [](Communicator&) {
    ColumnParallelLinearOptions co;
    co.param.dtype = DType::f64;
    RowParallelLinearOptions ro;
    ro.param.dtype = DType::f64;
    auto col = std::make_shared<ColumnParallelLinear>(5, 6, co);
    auto row = std::make_shared<RowParallelLinear>(6, 3, ro);
    Module m;
    m.register_module("c", col);
    m.register_module("r", row);
    m.init_parameters(kSeed);
    apply_lora(m, lora_cfg({"c", "r"}), kSeed);
    randomize_lora_b(m);
    Tensor x = randn({2, 3, 5}, 7, 1.0, DType::f64);
    check_grad(
        [&](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{row->forward(gelu(col->forward(in[0])))};
        },
        {x}, "x through the adapted layers");
    const RngStream st{3, 9};
    const double scale = 2.0, p = 0.25;
    Tensor w = randn({6, 5}, 8, 0.5, DType::f64), b = randn({6}, 9, 0.5, DType::f64);
    Tensor a = randn({R, 5}, 10, 0.5, DType::f64), bb = randn({6, R}, 11, 0.5, DType::f64);
    for (const double drop : {0.0, p})
      check_grad(
          [&](const std::vector<Tensor>& in) {
            Tensor xd = drop > 0 ? dropout(in[0], drop, true, &st) : in[0];
            return std::vector<Tensor>{
                add(linear(in[0], in[1], in[2]), mul(linear(linear(xd, in[3]), in[4]), scale))};
          },
          {x, w, b, a, bb}, drop > 0 ? "x, W, b, A, B with dropout" : "x, W, b, A, B");
  });
}

// Merging: W + scale * B A in place of the adapter gives the adapted layer's output.
TEST(Lora, MergedWeightsGiveTheAdaptedOutput) {
  run_tp(1, [](Communicator& g) {
    Chain c(false, nullptr);
    c.init_parameters(kSeed);
    apply_lora(c, lora_cfg({"up_proj", "down_proj"}), kSeed);
    randomize_lora_b(c);
    Tensor x = randn({B, S, HID}, 12);
    NoGradGuard ng;
    Tensor adapted = c.forward(x);
    std::map<std::string, Tensor> full;
    for (auto& [n, t] : c.state_dict()) full[n] = t.clone();
    merge_lora_weights(full, lora_cfg({}).lora_alpha / R);
    Chain plain(false, nullptr);
    StateDict sd;
    for (auto& [n, t] : full) sd.insert(n, t);
    plain.load_state_dict(sd);
    check_close(plain.forward(x), adapted, kTol, "merged");
    (void)g;
  });
}

TEST(Lora, RefusesWhatItCannotAdapt) {
  run_tp(1, [](Communicator&) {
    Chain c(false, nullptr);
    auto err = [&](const LoraConfig& cfg) -> std::string {
      try {
        apply_lora(c, cfg, 1);
      } catch (const ConfigError& e) {
        return e.what();
      }
      return "no error";
    };
    LoraConfig zero = lora_cfg({"up_proj"});
    zero.lora_rank = 0;
    EXPECT_NE(err(zero).find("lora_rank must be >= 1, got 0"), std::string::npos);
    EXPECT_NE(err(lora_cfg({})).find("target_modules is empty"), std::string::npos);
    EXPECT_THROW(
        check_lora_matches(lora_cfg({"o_proj"}), {apply_lora(c, lora_cfg({"o_proj"}), 1)}, {&c}),
        ConfigError);
  });
}

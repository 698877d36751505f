// GQAQKVColumnParallelLinear against the unsharded q/k/v projections, with K/V heads replicated
// by kv_size_multiplier when TP exceeds the KV head count (2 KV heads at TP 4 and 8), SP on and
// off, through a real grouped-query attention on each rank's local heads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nxd/layers/basic.h"
#include "nxd/layers/parallel/qkv.h"
#include "tp_util.h"

using namespace nxd;
using namespace nxd::testing;

namespace {

constexpr int64_t B = 2, S = 8, HID = 16, H = 8, HKV = 2, D = 4;
constexpr uint64_t kSeed = 5;
constexpr double kTol = 1e-5;

struct Ref : Module {
  std::shared_ptr<Linear> q, k, v;
  explicit Ref(bool bias) {
    LinearOptions lo;
    lo.bias = bias;
    lo.weight_init = ParamInit::normal(0.3);
    lo.bias_init = ParamInit::normal(0.5);
    q = register_module("q_proj", std::make_shared<Linear>(HID, H * D, lo));
    k = register_module("k_proj", std::make_shared<Linear>(HID, HKV * D, lo));
    v = register_module("v_proj", std::make_shared<Linear>(HID, HKV * D, lo));
  }
};

// Attention over heads: q [B,S,h*D], k/v [B,S,hkv*D] -> [B,S,h*D].
Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v) {
  auto heads = [](const Tensor& t) { return transpose(view(t, {B, S, t.size(-1) / D, D}), 1, 2); };
  Tensor o = scaled_dot_product_attention(heads(q), heads(k), heads(v), true);
  return reshape(transpose(o, 1, 2), {B, S, q.size(-1)});
}

GQAQKVColumnParallelLinearOptions options(bool bias, bool sp, int64_t m) {
  GQAQKVColumnParallelLinearOptions o;
  o.bias = bias;
  o.sequence_parallel_enabled = sp;
  o.kv_size_multiplier = m;
  o.head_dim = D;
  o.weight_init = ParamInit::normal(0.3);
  o.bias_init = ParamInit::normal(0.5);
  return o;
}

void run_gqa(int tp, bool sp, bool bias) {
  const int64_t m = std::max<int64_t>(1, tp / HKV);
  run_tp(tp, [&](Communicator& g) {
    const int r = g.rank();
    Ref ref(bias);
    ref.init_parameters(kSeed);
    Tensor xf = randn({B, S, HID}, 1), up = randn({B, S, H * D}, 2);
    Tensor xr = leaf(xf);
    Tensor orf = attend(ref.q->forward(xr), ref.k->forward(xr), ref.v->forward(xr));
    backward(sum(mul(orf, up)));

    GQAQKVColumnParallelLinear qkv(HID, H * D, HKV * D, options(bias, sp, m));
    qkv.init_parameters(kSeed);
    std::vector<std::string> names;
    for (auto& [n, t] : qkv.named_parameters()) names.push_back(n);
    std::vector<std::string> want{"q_proj.weight", "k_proj.weight", "v_proj.weight"};
    if (bias)
      want = {"q_proj.weight", "q_proj.bias",   "k_proj.weight",
              "k_proj.bias",   "v_proj.weight", "v_proj.bias"};
    EXPECT_EQ(names, want);
    const int64_t kp = qkv.local_kv_size(), blk = r / m;
    auto kv_rows = [&](const Tensor& full) {
      return full.detach().narrow(0, blk * kp, kp).clone();
    };
    EXPECT_BITWISE_EQ(qkv.get_parameter("q_proj.weight").detach(),
                      chunk_of(ref.q->weight(), 0, r, tp));
    EXPECT_BITWISE_EQ(qkv.get_parameter("k_proj.weight").detach(), kv_rows(ref.k->weight()));
    EXPECT_BITWISE_EQ(qkv.get_parameter("v_proj.weight").detach(), kv_rows(ref.v->weight()));

    Tensor x = leaf(sp ? chunk_of(xf, 1, r, tp) : xf);
    auto [q, k, v] = qkv.forward(x);
    Tensor o = attend(q, k, v);
    check_close(o, chunk_of(orf, -1, r, tp), kTol, "attention output (local heads)");
    backward(sum(mul(o, chunk_of(up, -1, r, tp))));
    check_close(grad_of(x), sp ? chunk_of(xr.grad(), 1, r, tp) : xr.grad(), kTol, "dX");
    check_gathered(g, grad_of(qkv.get_parameter("q_proj.weight")), 0, ref.q->weight().grad(), kTol,
                   "dWq gathered");
    for (auto [name, lin] : {std::pair{"k_proj", ref.k}, std::pair{"v_proj", ref.v}}) {
      std::string n(name);
      check_close(grad_of(qkv.get_parameter(n + ".weight")), kv_rows(lin->weight().grad()), kTol,
                  "d" + n + ".weight (replica block)");
      if (bias) {
        // dL/db_k is exactly 0 (softmax is invariant to q.b_k): compare absolutely.
        Tensor db = grad_of(qkv.get_parameter(n + ".bias")), dbr = kv_rows(lin->bias().grad());
        if (n == "k_proj")
          EXPECT_ALLCLOSE(db, dbr, 0, 1e-5);
        else
          check_close(db, dbr, kTol, "d" + n + ".bias (replica block)");
      }
    }
    if (bias)
      check_gathered(g, grad_of(qkv.get_parameter("q_proj.bias")), 0, ref.q->bias().grad(), kTol,
                     "dbq gathered");
    for (auto& p : parallel_parameters(qkv)) {
      EXPECT_EQ(p.attrs.tensor_model_parallel, tp > 1) << p.name;
      EXPECT_EQ(p.attrs.kv_replicas, p.name[0] == 'q' ? 1 : m) << p.name;
    }
  });
}

TEST(GQAQKVColumnParallelLinear, MatchesUnshardedProjections) {
  for (bool sp : {false, true})
    for (bool bias : {false, true})
      for (int tp : kDegrees) {
        SCOPED_TRACE(::testing::Message() << "tp=" << tp << " sp=" << sp << " bias=" << bias);
        run_gqa(tp, sp, bias);
      }
}

// gather_output: full q and de-replicated full k, v; gradients flow back through the replicas.
TEST(GQAQKVColumnParallelLinear, GatherOutput) {
  for (int tp : {1, 2, 4, 8}) {
    const int64_t m = std::max<int64_t>(1, tp / HKV);
    run_tp(tp, [&](Communicator& g) {
      const int r = g.rank();
      Ref ref(true);
      ref.init_parameters(kSeed);
      Tensor xf = randn({B, S, HID}, 3);
      Tensor rq = randn({B, S, H * D}, 4), rk = randn({B, S, HKV * D}, 5),
             rv = randn({B, S, HKV * D}, 6);
      Tensor xr = leaf(xf);
      backward(add(add(sum(mul(ref.q->forward(xr), rq)), sum(mul(ref.k->forward(xr), rk))),
                   sum(mul(ref.v->forward(xr), rv))));
      auto o = options(true, false, m);
      o.gather_output = true;
      GQAQKVColumnParallelLinear qkv(HID, H * D, HKV * D, o);
      qkv.init_parameters(kSeed);
      Tensor x = leaf(xf);
      auto [q, k, v] = qkv.forward(x);
      check_close(q, ref.q->forward(xf), kTol, "q");
      check_close(k, ref.k->forward(xf), kTol, "k");
      check_close(v, ref.v->forward(xf), kTol, "v");
      backward(add(add(sum(mul(q, rq)), sum(mul(k, rk))), sum(mul(v, rv))));
      check_close(grad_of(x), xr.grad(), kTol, "dX");
      const int64_t kp = qkv.local_kv_size();
      check_close(grad_of(qkv.get_parameter("k_proj.weight")),
                  ref.k->weight().grad().narrow(0, (r / m) * kp, kp), kTol, "dWk");
      check_close(grad_of(qkv.get_parameter("v_proj.bias")),
                  ref.v->bias().grad().narrow(0, (r / m) * kp, kp), kTol, "dbv");
    });
  }
}

TEST(GQAQKVColumnParallelLinear, InvalidReplicationThrows) {
  run_tp(4, [&](Communicator&) {
    using ::testing::HasSubstr;
    using ::testing::ThrowsMessage;
    // 2 KV heads cannot be split over 4 ranks without replication.
    auto no_heads = options(false, false, 1);
    no_heads.head_dim = 0;  // sizes only
    EXPECT_THAT([&] { GQAQKVColumnParallelLinear(HID, H * D, 6, no_heads); },
                ThrowsMessage<ShapeError>(HasSubstr(
                    "key/value output size 6 x kv_size_multiplier 1 is not divisible by tensor "
                    "parallel size 4")));
    EXPECT_THAT([] { GQAQKVColumnParallelLinear(HID, H * D, HKV * D, options(false, false, 1)); },
                ThrowsMessage<ShapeError>(HasSubstr(
                    "2 key/value heads x kv_size_multiplier 1 are not divisible by tensor "
                    "parallel size 4")));
    EXPECT_THAT([] { GQAQKVColumnParallelLinear(HID, H * D, HKV * D, options(false, false, 3)); },
                ThrowsMessage<ShapeError>(
                    HasSubstr("tensor parallel size 4 is not divisible by kv_size_multiplier 3")));
    EXPECT_THAT([] { GQAQKVColumnParallelLinear(HID, 6 * D, HKV * D, options(false, false, 2)); },
                ThrowsMessage<ShapeError>(
                    HasSubstr("6 query heads are not divisible by tensor parallel size 4")));
  });
}

}  // namespace

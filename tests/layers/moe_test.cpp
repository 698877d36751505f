// The mixture-of-experts layer (layers/moe/) and its ops: topk and scatter_add_rows gradchecks,
// the layer against a naive per-token reference (forward, every gradient, f64), gradcheck through
// the layer, the auxiliary loss by hand, capacity and drops, and expert parallelism on 2 and 4
// ranks against the single-rank layer (also run under mpirun: label mpi).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "nxd/autograd/ops.h"
#include "nxd/autograd/ops/moe.h"
#include "nxd/layers/moe/dispatch.h"
#include "nxd/layers/moe/moe.h"
#include "support/compare.h"
#include "support/random.h"
#include "support/ranks.h"

using namespace nxd;
using nxd::testing::check_grad;
using nxd::testing::randn;
using nxd::testing::run_ranks;

namespace {

MoeMlpOptions options(int64_t E, int64_t k, DType dt = DType::f64) {
  MoeMlpOptions o;
  o.hidden_size = 6;
  o.ffn_hidden_size = 5;
  o.moe.num_experts = E;
  o.moe.top_k = k;
  o.moe.router_aux_loss_coef = 0.1;
  o.init = InitScheme{InitMethod::normal, 0.5, 1};
  o.param = {dt, Device::host};
  return o;
}

// The layer computed token by token from the layer's own parameters with plain ops: softmax of
// the token's logits, its k largest (ties by lower index; the expert's capacity counted in token
// order), each selected expert's SwiGLU MLP on the token alone, weighted and summed. Returns
// {y, aux} (aux = coef * load-balancing + z_coef * z-loss).
std::pair<Tensor, Tensor> naive_moe(const MoeMlp& m, const MoeConfig& c, const Tensor& x) {
  const int64_t H = x.size(-1), T = x.numel() / H, E = c.num_experts, k = c.top_k;
  Tensor X = reshape(x, {T, H});
  const Tensor wg = m.get_parameter("gate.weight");
  auto w = [&](int64_t e, const char* n) {
    return m.get_parameter("experts." + std::to_string(e) + "." + n + ".weight");
  };
  const int64_t cap =
      c.dropless ? T * k : static_cast<int64_t>(std::ceil(c.capacity_factor * T * k / E));
  std::vector<int64_t> used(E, 0), load(E, 0);
  std::vector<Tensor> ys, probs, lses;
  for (int64_t t = 0; t < T; ++t) {
    Tensor xt = narrow(X, 0, t, 1);
    Tensor lt = linear(xt, wg);
    Tensor pt = softmax(lt, -1);
    probs.push_back(pt);
    lses.push_back(select(sub(lt, log_softmax(lt, -1)), 1, 0));
    std::vector<double> pv = pt.to_vector();
    std::vector<int64_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return pv[a] > pv[b]; });
    Tensor denom;
    std::vector<Tensor> v;
    for (int64_t j = 0; j < k; ++j) {
      v.push_back(narrow(pt, 1, order[j], 1));
      denom = j == 0 ? v.back() : add(denom, v.back());
    }
    Tensor yt = zeros({1, H}, x.dtype());
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[j];
      ++load[e];
      if (used[e]++ >= cap) continue;  // dropped
      Tensor h = swiglu(linear(xt, w(e, "w1")), linear(xt, w(e, "w3")));
      Tensor ye = linear(h, w(e, "w2"));
      Tensor vj = c.normalize_top_k_affinities ? div(v[j], denom) : v[j];
      yt = add(yt, mul(ye, vj));
    }
    ys.push_back(yt);
  }
  Tensor P = mean(cat(probs, 0), {0});
  std::vector<double> f(E);
  for (int64_t e = 0; e < E; ++e) f[e] = double(load[e]) / double(T);
  Tensor aux = mul(sum(mul(P, from_doubles(f, {E}, x.dtype()))),
                   c.router_aux_loss_coef * double(E) / double(k));
  if (c.router_z_loss_coef > 0)
    aux = add(aux, mul(mean(square(cat(lses, 0))), c.router_z_loss_coef));
  return {reshape(cat(ys, 0), x.shape()), aux};
}

// sum(y * r) + aux
Tensor objective(const Tensor& y, const Tensor& aux, const Tensor& r) {
  return add(sum(mul(y, r)), aux);
}

std::map<std::string, Tensor> grads_of(const Module& m) {
  std::map<std::string, Tensor> g;
  for (auto& [n, p] : m.named_parameters()) g[n] = p.grad();
  return g;
}

void zero_grads(const Module& m) {
  for (auto& p : m.parameters()) p.set_grad(Tensor());
}

}  // namespace

TEST(MoeOps, TopkValuesIndicesAndTies) {
  Tensor x = from_doubles({0.1, 0.5, 0.5, -1, 3, 2, 2, 2}, {2, 4}, DType::f64);
  auto r = topk(x, 2);
  EXPECT_EQ(r[1].to_vector_as<int64_t>(), (std::vector<int64_t>{1, 2, 0, 1}));
  EXPECT_EQ(r[0].to_vector(), (std::vector<double>{0.5, 0.5, 3, 2}));
  EXPECT_THROW(topk(x, 5), Error);
}

TEST(MoeOps, Gradchecks) {
  Tensor x = randn({5, 7}, 11);
  check_grad([](const std::vector<Tensor>& in) { return std::vector<Tensor>{topk(in[0], 3)[0]}; },
             {x}, "topk");
  Tensor src = randn({6, 3}, 12);
  Tensor idx = from_vector<int64_t>({2, 0, 2, 3, 0, 2}, {6});
  check_grad(
      [idx](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{scatter_add_rows(in[0], idx, 4)};
      },
      {src}, "scatter_add_rows");
  Tensor y = scatter_add_rows(src, idx, 4);
  EXPECT_NEAR(y.at({2, 1}), src.at({0, 1}) + src.at({2, 1}) + src.at({5, 1}), 1e-12);
  EXPECT_EQ(y.at({1, 0}), 0.0);
  EXPECT_THROW(scatter_add_rows(src, idx, 3), Error);  // index 3 out of [0, 3)
}

// Forward, aux and every gradient against the per-token reference, dropless and with drops,
// top-1 and top-2, normalized or not, with the z-loss.
TEST(MoeLayer, MatchesPerTokenReference) {
  struct Case {
    int64_t E, k;
    bool dropless, normalize;
    double cf, z;
  };
  for (const Case& cs : {Case{4, 2, true, true, 1.0, 0.0}, Case{4, 1, true, false, 1.0, 0.01},
                         Case{3, 2, false, true, 1.0, 0.0}, Case{5, 2, false, false, 0.5, 0.02}}) {
    MoeMlpOptions o = options(cs.E, cs.k);
    o.moe.dropless = cs.dropless;
    o.moe.normalize_top_k_affinities = cs.normalize;
    o.moe.capacity_factor = cs.cf;
    o.moe.router_z_loss_coef = cs.z;
    MoeMlp m(o);
    m.init_parameters(3);
    Tensor x = randn({2, 5, 6}, 21).set_requires_grad(true), r = randn({2, 5, 6}, 22);
    Tensor y = m.forward(x);
    backward(objective(y, m.aux_loss(), r));
    auto g = grads_of(m);
    Tensor gx = x.grad();
    zero_grads(m);
    x.set_grad(Tensor());
    auto [yr, auxr] = naive_moe(m, o.moe, x);
    backward(objective(yr, auxr, r));
    const std::string what = "E=" + std::to_string(cs.E) + " k=" + std::to_string(cs.k);
    EXPECT_TRUE(nxd::testing::close_rel(y, yr, 1e-12, what + " y"));
    EXPECT_NEAR(m.aux_loss().item(), auxr.item(), 1e-12) << what;
    EXPECT_TRUE(nxd::testing::close_rel(gx, x.grad(), 1e-12, what + " dx"));
    for (auto& [n, p] : m.named_parameters()) {
      if (!g[n].defined()) {  // an expert no token reached: none in the reference either
        EXPECT_FALSE(p.grad().defined()) << what << " " << n;
        continue;
      }
      EXPECT_TRUE(nxd::testing::close_rel(g[n], p.grad(), 1e-12, what + " d" + n));
    }
  }
}

TEST(MoeLayer, GradcheckThroughLayer) {
  MoeMlpOptions o = options(4, 2);
  o.moe.router_z_loss_coef = 0.05;
  o.moe.dropless = false;
  o.moe.capacity_factor = 0.75;
  MoeMlp m(o);
  m.init_parameters(5);
  // the objective sum(y * r) + aux by central differences against backward: the aux loss's
  // gradient is injected through y's backward with scale 1 (TrainingLossScale's default), its
  // factor in the objective (autograd's gradcheck seeds the output with another factor)
  const Tensor r = randn({7, 6}, 32), x0 = randn({7, 6}, 31);
  auto f = [&](const Tensor& x) {
    NoGradGuard ng;
    Tensor y = m.forward(x);
    return objective(y, m.aux_loss(), r).item();
  };
  Tensor x = x0.clone().set_requires_grad(true);
  backward(objective(m.forward(x), m.aux_loss(), r));
  const std::vector<double> gx = x.grad().to_vector();
  std::vector<double> xv = x0.to_vector();
  double worst = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    const double h = 1e-6, v = xv[i];
    xv[i] = v + h;
    const double up = f(from_doubles(xv, {7, 6}, DType::f64));
    xv[i] = v - h;
    const double dn = f(from_doubles(xv, {7, 6}, DType::f64));
    xv[i] = v;
    worst = std::max(worst, std::abs((up - dn) / (2 * h) - gx[i]));
  }
  EXPECT_LT(worst, 1e-6) << "largest |numeric - analytic| over dx";
}

// The load-balancing loss by hand (E/k * sum_e f_e P_e from host-computed probabilities) and the
// capacity: every token prefers expert 0, then 1, so with capacity 4 the last 4 tokens lose both.
TEST(MoeLayer, AuxLossAndDropsByHand) {
  const int64_t T = 8, H = 6, E = 4, k = 2;
  MoeMlpOptions o = options(E, k);
  o.moe.dropless = false;
  o.moe.capacity_factor = 1.0;  // cap = ceil(1.0 * 8 * 2 / 4) = 4 per expert
  o.moe.router_aux_loss_coef = 0.3;
  MoeMlp m(o);
  m.init_parameters(7);
  std::vector<double> wg(E * H);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t h = 0; h < H; ++h) wg[e * H + h] = 0.3 * double(E - 1 - e) + 0.01 * double(h);
  m.get_parameter("gate.weight").copy_(from_doubles(wg, {E, H}, DType::f64));
  std::vector<double> xv = randn({T, H}, 41).to_vector();
  for (double& v : xv) v = std::abs(v) + 0.1;
  Tensor x = from_doubles(xv, {T, H}, DType::f64);
  Tensor y = m.forward(x);
  const MoeStats& st = m.stats();
  EXPECT_EQ(st.tokens, T);
  EXPECT_EQ(st.assignments, T * k);
  EXPECT_EQ(st.dropped, 8);
  // (built element by element: with GCC 12.2 -O3 -march=native a braced {8, 8, 0, 0} here read
  // back as {8, 8, 8, 8} once the test above changed, printed right after construction; the cause
  // was not found)
  std::vector<int64_t> want_load(4, 0);
  want_load[0] = want_load[1] = 8;
  EXPECT_EQ(st.expert_load, want_load);
  // by hand: softmax of the logits per token, mean over tokens, f = {1, 1, 0, 0}
  std::vector<double> P(E, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> l(E);
    double mx = -1e300, z = 0;
    for (int64_t e = 0; e < E; ++e) {
      l[e] = 0;
      for (int64_t h = 0; h < H; ++h) l[e] += xv[t * H + h] * wg[e * H + h];
      mx = std::max(mx, l[e]);
    }
    for (int64_t e = 0; e < E; ++e) z += std::exp(l[e] - mx);
    for (int64_t e = 0; e < E; ++e) P[e] += std::exp(l[e] - mx) / z / double(T);
  }
  const double lb = double(E) / double(k) * (1.0 * P[0] + 1.0 * P[1]);
  EXPECT_NEAR(st.aux_loss, lb, 1e-12);
  EXPECT_NEAR(m.aux_loss().item(), 0.3 * lb, 1e-12);
  // tokens 4..7 lost both slots: no output; tokens 0..3 kept both
  for (int64_t t = 0; t < T; ++t) {
    double n = 0;
    for (int64_t h = 0; h < H; ++h) n += std::abs(y.at({t, h}));
    if (t >= 4)
      EXPECT_EQ(n, 0.0) << "token " << t;
    else
      EXPECT_GT(n, 0.0) << "token " << t;
  }
  // balanced routing gives the coefficient itself: f_e = k/E and P_e = 1/E -> E/k * E * k/E^2 = 1
}

// Expert parallelism on P sim ranks (each with its own tokens) against the single-rank layer on
// each rank's tokens: outputs, aux, dx and the router's gradient per rank; an expert's gradient
// is (1/P) times the sum of the single-rank gradients over the P token sets (so the mean over
// the expert-data-parallel group gives the global DP mean).
void expect_ep_matches(int P, bool dropless) {
  const int64_t E = 8, k = 2;
  MoeMlpOptions o = options(E, k);
  o.moe.dropless = dropless;
  o.moe.capacity_factor = 1.25;
  o.moe.router_z_loss_coef = 0.01;
  auto inputs = [](int r) { return randn({3, 4, 6}, 100 + r); };
  auto dirs = [](int r) { return randn({3, 4, 6}, 200 + r); };
  const bool ran = run_ranks(P, [&] {
    const int rank = world().rank();
    // the reference: the whole layer on every token set, gradients per set
    MoeMlp ref(o);
    ref.init_parameters(9);
    std::vector<std::map<std::string, Tensor>> rg(P);
    Tensor ry, rdx, raux;
    for (int s = 0; s < P; ++s) {
      Tensor x = inputs(s).set_requires_grad(true);
      Tensor y = ref.forward(x);
      backward(objective(y, ref.aux_loss(), dirs(s)));
      rg[s] = grads_of(ref);
      zero_grads(ref);
      if (s == rank) ry = y, rdx = x.grad(), raux = ref.aux_loss();
    }
    MoeMlpOptions po = o;
    po.ep_group = world_ptr();
    MoeMlp m(po);
    m.init_parameters(9);
    EXPECT_EQ(m.num_local_experts(), E / P);
    Tensor x = inputs(rank).set_requires_grad(true);
    Tensor y = m.forward(x);
    backward(objective(y, m.aux_loss(), dirs(rank)));
    const std::string what = "P=" + std::to_string(P) + " rank " + std::to_string(rank);
    EXPECT_TRUE(nxd::testing::close_rel(y, ry, 1e-12, what + " y"));
    EXPECT_NEAR(m.aux_loss().item(), raux.item(), 1e-12) << what;
    EXPECT_TRUE(nxd::testing::close_rel(x.grad(), rdx, 1e-12, what + " dx"));
    for (auto& [n, p] : m.named_parameters()) {
      ASSERT_TRUE(rg[0].count(n)) << what << " " << n;
      Tensor want;
      if (n.rfind("gate.", 0) == 0) {
        want = rg[rank][n];
      } else {
        for (int s = 0; s < P; ++s) {
          if (!rg[s][n].defined()) continue;
          want = want.defined() ? add(want, rg[s][n]) : rg[s][n];
        }
        if (want.defined()) want = mul(want, 1.0 / P);
      }
      if (!want.defined()) {
        EXPECT_FALSE(p.grad().defined()) << what << " " << n;
        continue;
      }
      ASSERT_TRUE(p.grad().defined()) << what << " " << n;
      EXPECT_TRUE(nxd::testing::close_rel(p.grad(), want, 1e-12, what + " d" + n));
    }
  });
  if (!ran) GTEST_SKIP() << "needs " << P << " ranks";
}

TEST(MoeLayer, ExpertParallel2MatchesSingleRank) {
  expect_ep_matches(2, true);
  expect_ep_matches(2, false);
}
TEST(MoeLayer, ExpertParallel4MatchesSingleRank) {
  expect_ep_matches(4, true);
  expect_ep_matches(4, false);
}

TEST(MoeLayer, ConfigErrors) {
  MoeConfig c;
  c.num_experts = 4;
  c.top_k = 5;
  EXPECT_THROW(c.validate(), ConfigError);
  c.top_k = 2;
  c.frequency = 0;
  EXPECT_THROW(c.validate(), ConfigError);
  c.frequency = 2;
  EXPECT_NO_THROW(c.validate());
  EXPECT_TRUE(c.is_moe_layer(0) && !c.is_moe_layer(1) && c.is_moe_layer(2));
  EXPECT_THROW(c.validate_parallel(3), ConfigError);
  EXPECT_NO_THROW(c.validate_parallel(2));
}

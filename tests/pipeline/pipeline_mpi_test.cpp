// PP2 x DP2 training against the single-rank model, written to run on either backend: on sim
// ranks in the normal suite, and one rank per process under `mpirun -np 4` (label mpi; the main
// is tests/collectives/main.cpp). Every rank computes the single-rank reference itself first, so
// nothing has to travel between processes but the pipeline's own messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/optim/optimizer.h"
#include "nxd/pipeline/pipeline_model.h"
#include "support/compare.h"
#include "support/ranks.h"
#include "support/tiny_models.h"

using namespace nxd;
using namespace nxd::pipeline;
namespace ps = nxd::parallel_state;

namespace {

ModelConfig config() {
  ModelConfig c = nxd::testing::micro_model();
  c.num_layers = 4;
  c.tie_word_embeddings = true;
  return c;
}

Tensor ids_of(int64_t B, int64_t S, uint64_t seed) {
  RngStream s{seed, 17};
  std::vector<int64_t> v(B * S);
  for (int64_t i = 0; i < B * S; ++i) v[i] = static_cast<int64_t>(s.uniform_f64(i) * 32);
  return from_vector<int64_t>(v, {B, S});
}

constexpr int kSteps = 20, kM = 2, kDP = 2;
constexpr int64_t kB = 8, kS = 8;
constexpr double kLr = 0.05;

std::vector<optim::ParamGroup> groups(std::vector<optim::NamedParam> p) {
  return {optim::ParamGroup{"all", std::move(p), kLr}};
}

// The single-rank run: each step accumulates the DP ranks' microbatches (kDP * kM of them).
std::vector<double> single_rank_losses(std::map<std::string, Tensor>& final_weights) {
  auto m = make_causal_lm(config(), 7);
  std::vector<optim::NamedParam> params;
  for (auto& [n, t] : m->named_parameters()) params.push_back({n, t});
  optim::SGD opt(groups(params));
  std::vector<double> losses;
  const int n = kDP * kM;
  for (int s = 0; s < kSteps; ++s) {
    m->zero_grad();
    Tensor ids = ids_of(kB, kS, 100 + s), tg = ids_of(kB, kS, 200 + s);
    double loss = 0;
    for (int i = 0; i < n; ++i) {
      const int64_t r = kB / n;
      Tensor l =
          mul(m->loss(ids.narrow(0, i * r, r).contiguous(), tg.narrow(0, i * r, r).contiguous()),
              1.0 / n);
      backward(l);
      loss += l.item();
    }
    losses.push_back(loss);
    opt.step();
  }
  for (auto& [name, t] : m->named_parameters()) final_weights[name] = t.detach().clone();
  return losses;
}

// 20 SGD steps of TP x PP x DP (DP = 2) against one rank: each step's loss within 1e-4, the
// final parameters (gathered over TP) within 1e-4.
void train_like_one_rank(int tp, int pp, bool sp) {
  const bool ran = nxd::testing::run_ranks(tp * pp * kDP, [&] {
    std::map<std::string, Tensor> want;
    ModelConfig cfg = config();
    cfg.sequence_parallel = sp;
    const std::vector<double> ref = single_rank_losses(want);
    ps::initialize_model_parallel(tp, pp);
    PipelineOptions o;
    o.num_microbatches = kM;
    PipelineModel pm(cfg, 7, o);
    optim::SGD opt(groups(pm.local_named_parameters()));
    const int64_t rows = kB / kDP, d = ps::get_data_parallel_rank();
    double worst = 0;
    for (int s = 0; s < kSteps; ++s) {
      pm.zero_grad();
      Tensor ids = ids_of(kB, kS, 100 + s), tg = ids_of(kB, kS, 200 + s);
      const double loss = pm.run_train(ids.narrow(0, d * rows, rows).contiguous(),
                                       tg.narrow(0, d * rows, rows).contiguous())
                              .item();
      EXPECT_NEAR(loss, ref[s], 1e-4 * std::abs(ref[s])) << "step " << s;
      worst = std::max(worst, std::abs(loss - ref[s]) / std::abs(ref[s]));
      opt.step();
    }
    Communicator& g = ps::get_tensor_model_parallel_group();
    for (auto& chunk : pm.chunks())
      for (const ParallelParameter& p : parallel_parameters(*chunk)) {
        Tensor full = p.attrs.tensor_model_parallel
                          ? g.all_gather(p.tensor.detach().contiguous(), p.attrs.partition_dim)
                          : p.tensor.detach();
        EXPECT_TRUE(nxd::testing::close_rel(full, want.at(p.name), 1e-4, p.name));
      }
    if (world().rank() == 0)
      std::printf("    tp=%d pp=%d dp=%d%s: %d SGD steps, largest relative loss difference %.3g\n",
                  tp, pp, kDP, sp ? " sp" : "", kSteps, worst);
  });
  if (!nxd::testing::under_mpi()) {
    EXPECT_TRUE(ran);
  }
}

}  // namespace

TEST(PipelineMpi, PP2xDP2TrainsLikeOneRank) {
  train_like_one_rank(1, 2, false);
}

TEST(PipelineSim, TP2xPP2xDP2TrainsLikeOneRank) {
  train_like_one_rank(2, 2, true);
}

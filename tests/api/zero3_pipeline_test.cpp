// ZeRO-3 under pipeline parallelism through NxD's wrappers (docs/design/fsdp.md, "Composition"):
// PP 2 x DP 2 with GPipe, 1F1B and interleaved (two chunks a rank) over 20 clipped AdamW steps of
// 4 microbatches gives ZeRO-1's losses, gradient norms and weights bitwise (one parameter per
// bucket: the same bucket layout) and plain DP's within 1e-6, untied and with the embedding tied
// across the first and last stage; the first stage's embedding is a lookup unit and the last
// stage's final norm and head a root unit, and after every step no unit is gathered or in flight
// and no parameter's full storage exists (every one held as its shard); a unit's prefetch never
// leaves its chunk. On sim ranks here, and under mpirun -np 4 (label mpi:
// nxd_api_zero3_pipeline_mpi_np4).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>

#include "nxd/api/nxd_api.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/param_unit.h"
#include "nxd/optim/zero3_unit.h"
#include "nxd/runtime/context.h"
#include "support/ranks.h"
#include "support/tiny_models.h"

using namespace nxd;
using namespace nxd::api;

namespace {

constexpr int kSteps = 20;

// What the ranks of this process saw (every rank under sim, its own under mpirun).
struct Trace {
  std::map<int, std::vector<double>> losses, norms;  // by rank (every rank returns the same)
  std::map<std::string, std::vector<float>> params;  // "rank/name" after the last step
  int gathered_at_step = 0;  // units gathered or in flight after a step, summed over steps
  int whole_at_step = 0;     // parameters with their full storage after a step, summed
  int lookup_units = 0, root_units = 0;  // over the ranks: units outside the decoder layers
};

// The ZeRO-3 units of this rank's chunks (none below stage 3).
std::vector<std::shared_ptr<optim::ShardedUnit>> units_of(const NxDModel& model) {
  std::vector<std::shared_ptr<optim::ShardedUnit>> out;
  for (Module* m : model.local_modules())
    for (auto& [name, sub] : m->named_modules())
      if (auto u = std::dynamic_pointer_cast<optim::ShardedUnit>(sub->param_unit()))
        out.push_back(u);
  return out;
}

// Whether a unit's module is a decoder layer (not the embedding's lookup unit or a root unit).
bool is_layer(const Module& m) {
  return dynamic_cast<const DecoderLayer*>(&m) != nullptr;
}

Trace train(optim::ZeroStage stage, pipeline::ScheduleKind schedule, int vpp, bool tied = false,
            optim::PipelineHeadUnit head = optim::PipelineHeadUnit::sharded) {
  Trace t;
  std::mutex mu;
  nxd::testing::run_ranks(4, [&] {
    NxDConfig want;
    want.pipeline_parallel_size = 2;
    want.pipeline_config.num_microbatches = 4;
    want.pipeline_config.schedule = schedule;
    want.pipeline_config.virtual_pipeline_size = vpp;
    want.optimizer_config.zero_stage = stage;
    want.optimizer_config.zero3_pipeline_head = head;
    want.optimizer_config.max_grad_norm = 0.05;  // clips every step
    want.grad_bucket_mb = 1e-6;                  // one parameter per bucket at every stage
    const NxDConfig cfg = neuronx_distributed_config(want);
    ModelConfig mc = nxd::testing::tiny_gqa_llama(4);
    mc.tie_word_embeddings = tied;
    auto model = initialize_parallel_model(cfg, mc, 3);
    auto opt = initialize_parallel_optimizer(
        cfg, *model, optim::default_param_groups(model->local_named_parameters(), 1e-2, 0.1),
        optim::AdamWOptions{});
    const auto units = units_of(*model);
    int lookups = 0, roots = 0;
    for (Module* m : model->local_modules())
      for (auto& [name, sub] : m->named_modules())
        if (sub->param_unit() && !is_layer(*sub)) ++(sub == m ? roots : lookups);
    const int d = parallel_state::get_data_parallel_rank();
    for (int step = 0; step < kSteps; ++step) {
      std::vector<Tensor> ids, tg;
      for (int q = 2 * d; q < 2 * d + 2; ++q) {  // 8 rows a DP rank: 4 microbatches of 2
        ids.push_back(nxd::testing::random_ids(900u + step, q, 64));
        tg.push_back(nxd::testing::random_ids(1900u + step, q, 64));
      }
      const double loss = model->run_train(cat_raw(ids, 0), cat_raw(tg, 0)).item();
      opt->step();
      opt->zero_grad();
      int gathered = 0, whole = 0;
      for (const auto& u : units) gathered += u->gathered() ? 1 : 0;
      for (const auto& p : model->local_named_parameters())
        whole += p.param.storage()->has_data() ? 1 : 0;
      std::lock_guard<std::mutex> l(mu);
      t.gathered_at_step += gathered;
      t.whole_at_step += whole;
      t.losses[current_context().rank()].push_back(loss);
      t.norms[current_context().rank()].push_back(opt->grad_norm().value());
    }
    const std::vector<Module*> chunks = model->local_modules();
    const WholeParameters whole(std::vector<const Module*>(chunks.begin(), chunks.end()));
    std::lock_guard<std::mutex> l(mu);
    t.lookup_units += lookups;
    t.root_units += roots;
    for (const auto& p : model->local_named_parameters())
      t.params[std::to_string(current_context().rank()) + "/" + p.name] =
          p.param.detach().to_vector_as<float>();
  });
  return t;
}

// The largest relative difference over every rank's series (INFINITY if they differ in shape).
double worst_rel(const std::map<int, std::vector<double>>& a,
                 const std::map<int, std::vector<double>>& b) {
  double w = a.size() == b.size() && !a.empty() ? 0 : INFINITY;
  for (const auto& [r, x] : b) {
    const auto it = a.find(r);
    if (it == a.end() || it->second.size() != x.size()) return INFINITY;
    for (size_t i = 0; i < x.size(); ++i)
      w = std::max(w, std::abs(it->second[i] - x[i]) / std::max(std::abs(x[i]), 1e-30));
  }
  return w;
}

// The largest absolute difference of the two runs' weights (every stage's parameters).
double worst_weight(const Trace& a, const Trace& b) {
  double w = a.params.size() == b.params.size() && !a.params.empty() ? 0 : INFINITY;
  for (const auto& [name, v] : b.params) {
    const auto it = a.params.find(name);
    if (it == a.params.end() || it->second.size() != v.size()) return INFINITY;
    for (size_t i = 0; i < v.size(); ++i)
      w = std::max(w, static_cast<double>(std::abs(it->second[i] - v[i])));
  }
  return w;
}

}  // namespace

namespace {

void compare_stages(pipeline::ScheduleKind schedule, int vpp, bool tied) {
  const std::string what =
      pipeline::schedule_name(schedule) + std::string(tied ? ", tied" : ", untied");
  const Trace plain = train(optim::ZeroStage::none, schedule, vpp, tied);
  const Trace one = train(optim::ZeroStage::one, schedule, vpp, tied);
  const Trace three = train(optim::ZeroStage::three, schedule, vpp, tied);
  const double l1 = worst_rel(three.losses, one.losses), n1 = worst_rel(three.norms, one.norms);
  const double w1 = worst_weight(three, one);
  const double l0 = worst_rel(three.losses, plain.losses);
  const double n0 = worst_rel(three.norms, plain.norms), w0 = worst_weight(three, plain);
  std::printf(
      "    PP2 x DP2 %s: ZeRO-3 vs ZeRO-1 losses %.3g, norms %.3g, weights %.3g; vs plain DP "
      "losses %.3g, norms %.3g, weights %.3g; lookup units %d, root units %d (over the ranks)\n",
      what.c_str(), l1, n1, w1, l0, n0, w0, three.lookup_units, three.root_units);
  for (const auto& [r, l] : three.losses) {
    ASSERT_EQ(l.size(), static_cast<size_t>(kSteps)) << what;
    EXPECT_LT(l.back(), l.front()) << what << ": it trains";
  }
  EXPECT_EQ(l1, 0.0) << what;
  EXPECT_EQ(n1, 0.0) << what;
  EXPECT_EQ(w1, 0.0) << what;
  EXPECT_LE(l0, 1e-6) << what;
  EXPECT_LE(n0, 1e-6) << what;
  EXPECT_LE(w0, 1e-6) << what;
  EXPECT_EQ(three.gathered_at_step, 0) << what << ": a unit left gathered at the step";
  EXPECT_EQ(three.whole_at_step, 0) << what << ": a parameter held whole at the step";
  // the first stage's embedding on its two DP ranks (under mpirun: this process's rank only)
  if (three.losses.size() == 4) {
    EXPECT_EQ(three.lookup_units, 2) << what;
    EXPECT_EQ(three.root_units, 2) << what << ": the last stage's final norm and head";
  }
}

}  // namespace

TEST(Zero3Pipeline, Pp2Dp2MatchesZero1BitwiseAndPlainDpUnderEverySchedule) {
  using pipeline::ScheduleKind;
  compare_stages(ScheduleKind::gpipe, 1, false);
  compare_stages(ScheduleKind::one_f_one_b, 1, false);
  compare_stages(ScheduleKind::interleaved, 2, false);
}

// Tied embeddings across the first and last stage: each stage's copy is in that stage's units
// (the first stage's a lookup unit, the last stage's in its root unit with the final norm, read
// by the head), and the pipeline sums the two gradients before the optimizer reduces them.
TEST(Zero3Pipeline, Pp2Dp2TiedEmbeddingsMatchZero1Bitwise) {
  using pipeline::ScheduleKind;
  compare_stages(ScheduleKind::one_f_one_b, 1, true);
  compare_stages(ScheduleKind::interleaved, 2, true);
}

// By default (optimizer_config.zero3_pipeline_head whole) the last stage keeps its final norm and
// head whole: no root unit, the first stage's embedding still a lookup unit, the same results.
TEST(Zero3Pipeline, TheHeadsStageKeepsItsRootWholeByDefault) {
  using pipeline::ScheduleKind;
  const Trace sharded = train(optim::ZeroStage::three, ScheduleKind::one_f_one_b, 1);
  const Trace whole = train(optim::ZeroStage::three, ScheduleKind::one_f_one_b, 1, false,
                            optim::PipelineHeadUnit::whole);
  EXPECT_EQ(worst_rel(whole.losses, sharded.losses), 0.0);
  EXPECT_EQ(worst_weight(whole, sharded), 0.0);
  EXPECT_EQ(whole.root_units, 0);
  EXPECT_EQ(whole.gathered_at_step, 0);
  if (whole.losses.size() == 4) EXPECT_EQ(whole.lookup_units, 2);
}

// Each chunk's layers are one prefetch chain: the last layer of a chunk prefetches nothing, so at
// the end of a chunk's forward only its own units were gathered, and none stays in flight.
TEST(Zero3Pipeline, PrefetchStaysInsideAChunk) {
  nxd::testing::run_ranks(4, [&] {
    NxDConfig want;
    want.pipeline_parallel_size = 2;
    want.pipeline_config.num_microbatches = 2;
    want.pipeline_config.schedule = pipeline::ScheduleKind::interleaved;
    want.pipeline_config.virtual_pipeline_size = 2;
    want.optimizer_config.zero_stage = optim::ZeroStage::three;
    want.optimizer_config.reshard_after_forward = false;  // a forward leaves its units gathered
    // two layers a stage: rank 0 holds layers 0-1 and 4-5, rank 1 layers 2-3 and 6-7
    want.pipeline_config.pipeline_cuts = {"model.layers.1", "model.layers.3", "model.layers.5"};
    const NxDConfig cfg = neuronx_distributed_config(want);
    auto model = initialize_parallel_model(cfg, nxd::testing::tiny_gqa_llama(8), 3);
    auto opt = initialize_parallel_optimizer(
        cfg, *model, optim::default_param_groups(model->local_named_parameters(), 1e-2, 0.1),
        optim::AdamWOptions{});
    const auto modules = model->local_modules();
    ASSERT_EQ(modules.size(), 2u);
    auto& first = dynamic_cast<CausalLM&>(*modules[0]);
    std::vector<std::shared_ptr<optim::ShardedUnit>> units;  // the layers' (not the root's)
    for (Module* m : modules)
      for (auto& [name, sub] : m->named_modules())
        if (auto u = std::dynamic_pointer_cast<optim::ShardedUnit>(sub->param_unit());
            u && is_layer(*sub))
          units.push_back(u);
    ASSERT_EQ(units.size(), 4u);  // two layers in each of two chunks
    // chunk 0's forward with a graph: without reshard_after_forward its units stay gathered
    Tensor h;
    if (parallel_state::get_pipeline_model_parallel_rank() == 0) {
      h = first.embed(nxd::testing::random_ids(5, 0, 64));
    } else {  // the received activation
      h = zeros({4, 16, first.config().hidden_size});
      h.set_requires_grad(true);
    }
    const Tensor out = first.decoder_layers(h);
    EXPECT_TRUE(units[0]->gathered());
    EXPECT_TRUE(units[1]->gathered());
    EXPECT_FALSE(units[2]->gathered()) << "chunk 0's last layer prefetched chunk 1's first";
    EXPECT_FALSE(units[3]->gathered());
  });
}

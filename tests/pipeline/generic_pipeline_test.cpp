// The generic pipeline (GenericPipelineModel over a PipelineSequential) against the single-rank
// model: the same microbatches accumulated on one rank (backward of loss_mb / (M * dp) each, DP
// rank d's microbatches d*M .. d*M + M - 1) give the reference loss, per-microbatch losses,
// gradients and eval outputs. At TP 1 x DP 1 without tied weights each stage runs the reference's
// operations in its order, so the gradients must be bitwise equal; with TP, DP (a different
// summation order) or a tied weight (its two stages' gradients summed after the schedule) they
// must agree within 1e-6 relative (max|a-b| / max|b| per tensor: f32 sums of a handful of terms
// differ by a few ulps). Runs on sim ranks, and under mpirun -np 4 (label mpi).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <string>

#include "generic_models.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/pipeline/generic_pipeline.h"
#include "nxd/runtime/init.h"
#include "support/compare.h"
#include "support/gather_tp.h"
#include "support/ranks.h"

using namespace nxd;
using namespace nxd::pipeline;
using nxd::testing::gather_tp;
using nxd::testing::HeadKind;
using nxd::testing::HeadOutputs;
using nxd::testing::run_ranks;
namespace ps = nxd::parallel_state;

namespace {

constexpr int64_t kD = 4, kH = 8, kB = 16;
constexpr int kBlocks = 4;
constexpr uint64_t kSeed = 11;

Tensor normal(const Shape& s, uint64_t stream) {
  Tensor t = zeros(s);
  init::normal(t, RngStream{42, stream}, 0.0, 1.0);
  return t;
}
Batch batch() {
  return {{"x", normal({kB, kD}, 1)}, {"y", normal({kB, kD}, 2)}};
}
Batch rows(const Batch& b, int64_t begin, int64_t n) {
  Batch out;
  for (const auto& [k, t] : b) out[k] = t.narrow(0, begin, n).contiguous();
  return out;
}

LossSpec custom_loss() {
  LossSpec l;
  l.loss_fn = [](const std::vector<Tensor>& outs, const Batch& mb) {
    return nxd::testing::mse(outs.at(0), mb.at("y"));
  };
  return l;
}

struct Case {
  std::string what;
  int tp = 1, pp = 2, dp = 1;
  HeadKind head = HeadKind::linear;
  HeadOutputs outs = HeadOutputs::prediction;
  GenericPipelineOptions opts;
  bool bitwise = false;
};

struct Reference {
  double loss = 0;
  std::vector<double> mb_losses;  // microbatch i averaged over the DP ranks (as returned)
  std::map<std::string, Tensor> grads;
  Tensor prediction;  // forward of the whole batch, microbatch by microbatch
};

std::shared_ptr<PipelineSequential> model(const Case& c, ParamOptions po = {}) {
  return nxd::testing::regressor(kD, kH, kBlocks, c.head, c.outs, kSeed, po);
}

Reference reference(const Case& c) {
  Reference r;
  const int M = c.opts.num_microbatches, n = M * c.dp;
  {
    auto m = model(c);
    const Batch b = batch();
    const int64_t per = kB / n;
    r.mb_losses.assign(M, 0.0);
    std::vector<Tensor> preds;
    for (int i = 0; i < n; ++i) {
      const Batch mb = rows(b, i * per, per);
      std::vector<Tensor> outs = m->forward(mb);
      preds.push_back(outs.front().detach());
      Tensor l = c.opts.loss.loss_fn ? c.opts.loss.loss_fn(outs, mb) : outs.at(1);
      r.mb_losses[i % M] += l.item() / c.dp;
      Tensor scaled = mul(l, 1.0 / n);
      backward(scaled);
      r.loss += scaled.item();
    }
    r.prediction = cat(preds, 0);
    for (auto& [name, t] : m->named_parameters()) r.grads[name] = t.grad().clone();
  }
  return r;
}

struct Worst {
  std::mutex mu;
  double rel = 0;
  std::string what;
  void add(const Tensor& a, const Tensor& b, const std::string& w, bool bitwise) {
    if (bitwise)
      EXPECT_TRUE(nxd::testing::bitwise_equal(a, b, w));
    else
      EXPECT_TRUE(nxd::testing::close_rel(a, b, 1e-6, w));
    if (a.shape() != b.shape()) return;
    const double d = nxd::testing::diff(a, b).rel();
    std::lock_guard<std::mutex> g(mu);
    if (d > rel || what.empty()) rel = d, what = w;
  }
};

// Trains one step and evaluates once on (tp, pp, dp) ranks; compares with the reference.
void check(Case c) {
  SCOPED_TRACE(c.what);
  c.opts.return_mb_loss = true;
  Worst worst;
  const bool ran = run_ranks(c.tp * c.pp * c.dp, [&] {
    // every rank computes the reference first (no parallel state yet: one rank's model), so
    // nothing but the pipeline's own messages travels between MPI processes
    const Reference ref = reference(c);
    ps::initialize_model_parallel(c.tp, c.pp);
    GenericPipelineModel pm(model(c), c.opts);
    const int64_t per = kB / c.dp, d = ps::get_data_parallel_rank();
    const Batch b = rows(batch(), d * per, per);
    PipelineResult r = pm.run_train(b);
    worst.add(r.loss, scalar(ref.loss), "loss", false);
    worst.add(from_vector<double>(r.mb_losses, {c.opts.num_microbatches}),
              from_vector<double>(ref.mb_losses, {c.opts.num_microbatches}), "mb_losses", false);
    std::map<const TensorImpl*, ParallelAttrs> attrs;
    for (const Piece* p : pm.local_pieces())
      for (const ParallelParameter& pp : parallel_parameters(*p->module))
        attrs[pp.tensor.impl()] = pp.attrs;
    for (const optim::NamedParam& p : pm.local_named_parameters()) {
      ASSERT_TRUE(ref.grads.count(p.name)) << p.name << " is not a parameter of the whole model";
      ASSERT_TRUE(p.param.grad().defined()) << "no gradient for " << p.name;
      worst.add(gather_tp(p.param.grad(), attrs.at(p.param.impl())), ref.grads.at(p.name),
                p.name + ".grad", c.bitwise);
    }
    // eval: the outputs over this DP rank's rows, on the last stage
    PipelineResult e = pm.run_eval(b);
    const bool last = ps::get_pipeline_model_parallel_rank() == c.pp - 1;
    EXPECT_EQ(e.outputs.size(), last ? (c.outs == HeadOutputs::prediction ? 1u : 2u) : 0u);
    if (last)
      worst.add(e.outputs.at(0), ref.prediction.narrow(0, d * per, per), "eval outputs", c.bitwise);
  });
  if (!nxd::testing::under_mpi()) {
    EXPECT_TRUE(ran);
  }
  std::printf("    [%s] largest relative difference %.3g (%s)%s\n", c.what.c_str(), worst.rel,
              worst.what.c_str(), c.bitwise ? ", gradients bitwise equal" : "");
}

Case schedule_case(ScheduleKind k, int tp, int dp) {
  Case c;
  c.tp = tp;
  c.dp = dp;
  c.opts.num_microbatches = 4;
  c.opts.schedule = k;
  c.opts.virtual_pipeline_size = k == ScheduleKind::interleaved ? 2 : 1;
  c.opts.transformer_layer_cls = "ResBlock";
  c.opts.loss = custom_loss();
  c.bitwise = tp == 1 && dp == 1;
  c.what = std::string(schedule_name(k)) + " tp=" + std::to_string(tp) +
           " pp=2 dp=" + std::to_string(dp) + " custom loss";
  return c;
}

}  // namespace

TEST(GenericPipeline, CustomLossMatchesOneRankAtEverySchedule) {
  for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved})
    check(schedule_case(k, 1, 1));
}

TEST(GenericPipeline, Pp2Tp2Dp2MatchesOneRankAtEverySchedule) {
  for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved})
    check(schedule_case(k, 2, 2));
}

// 4 ranks (what the mpi test runs): PP2 x DP2 and PP2 x TP2.
TEST(GenericPipeline, Pp2Dp2AndPp2Tp2MatchOneRank) {
  for (ScheduleKind k :
       {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved}) {
    check(schedule_case(k, 1, 2));
    check(schedule_case(k, 2, 1));
  }
}

// The model's own loss (output_loss_value_spec {false, true}), a head tied to the embedding, and
// explicit pipeline_cuts.
TEST(GenericPipeline, TiedWeightAndOutputLossSpecMatchOneRank) {
  for (ScheduleKind k :
       {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved}) {
    Case c = schedule_case(k, 1, 1);
    c.head = HeadKind::tied;
    c.outs = HeadOutputs::prediction_and_loss;
    c.opts.loss = LossSpec{.output_loss_value_spec = {false, true}};
    if (k == ScheduleKind::one_f_one_b) {
      c.opts.transformer_layer_cls.clear();
      c.opts.pipeline_cuts = {"block1"};
    }
    c.bitwise = false;
    c.what = std::string(schedule_name(k)) + " pp=2 tied head, output_loss_value_spec" +
             (c.opts.pipeline_cuts.empty() ? "" : ", pipeline_cuts");
    check(c);
  }
}

TEST(GenericPipeline, TiedWeightIsNamedOnceAndCountedOnceInTheNorm) {
  Case c = schedule_case(ScheduleKind::one_f_one_b, 1, 1);
  c.head = HeadKind::tied;
  run_ranks(2, [&] {
    ps::initialize_model_parallel(1, 2);
    GenericPipelineModel pm(model(c), c.opts);
    EXPECT_EQ(pm.tied(), std::vector<std::string>{"embed.weight"});
    int held = 0, counted = 0;
    for (const optim::NormParam& p : pm.norm_params())
      if (p.name == "embed.weight") ++held, counted += p.shared ? 0 : 1;
    EXPECT_EQ(held, 1);
    EXPECT_EQ(counted, ps::get_pipeline_model_parallel_rank() == 0 ? 1 : 0);
  });
}

namespace {
void expect_config_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(GenericPipeline, RefusalsNameTheValue) {
  const Case base = schedule_case(ScheduleKind::one_f_one_b, 1, 1);
  auto build = [&](const std::function<void(GenericPipelineOptions&)>& edit, int pp = 1) {
    return [&, edit, pp] {
      GenericPipelineOptions o = base.opts;
      edit(o);
      if (pp == 1) {
        GenericPipelineModel pm(model(base), o);
        pm.run_train(batch());
        return;
      }
      // every pp rank builds the same model and refuses it alike
      std::string err;
      run_ranks(pp, [&] {
        ps::initialize_model_parallel(1, pp);
        try {
          GenericPipelineModel pm(model(base), o);
        } catch (const ConfigError& e) {
          if (ps::get_pipeline_model_parallel_rank() == 0) err = e.what();
        }
      });
      if (!err.empty()) throw ConfigError(err);
    };
  };
  expect_config_error(build([](auto& o) { o.transformer_layer_cls = "DecoderLayer"; }, 2),
                      "transformer_layer_cls 'DecoderLayer' is the class of no piece");
  expect_config_error(build([](auto& o) { o.transformer_layer_cls.clear(); }, 2),
                      "need transformer_layer_cls or pipeline_cuts");
  expect_config_error(build([](auto& o) { o.pipeline_cuts = {"block9"}; }, 2),
                      "pipeline_cuts names 'block9', which is no piece");
  expect_config_error(build([](auto& o) { o.pipeline_cuts = {"head"}; }, 2),
                      "the last stage would hold no piece");
  expect_config_error(build(
                          [](auto& o) {
                            o.pipeline_cuts = {"block0", "block1"};
                          },
                          2),
                      "2 pipeline_cuts for 2 stages");
  expect_config_error(build([](auto& o) {
                        o.loss = LossSpec{.output_loss_value_spec = {false, false}};
                      }),
                      "names 0 outputs as the loss");
  expect_config_error(build([](auto& o) {
                        o.loss = LossSpec{.output_loss_value_spec = {false, true}};
                      }),
                      "output_loss_value_spec has 2 entries, the model returns 1 output(s)");
  expect_config_error(build([](auto& o) { o.loss = LossSpec{}; }), "neither");
  expect_config_error(build([](auto& o) {
                        o.loss.loss_fn = [](const std::vector<Tensor>& outs, const Batch&) {
                          return outs.at(0);  // the prediction, not a scalar
                        };
                      }),
                      "the loss must be a scalar");
  expect_config_error(build([](auto& o) {
                        o.input_names = {"x", "labels"};
                      }),
                      "input_names names 'labels', which the batch lacks; it has: x, y");
  auto stray = [&] {
    auto m = model(base);
    m->register_parameter("scale", ones({1}));
    GenericPipelineModel pm(m, base.opts);
  };
  expect_config_error(stray, "parameter 'scale' belongs to no piece");
}

// input_names (NxD's) picks the batch's tensors the pieces see: a tensor of other rows is
// refused without it and ignored with it.
TEST(GenericPipeline, InputNamesSelectTheBatchTensors) {
  const Case base = schedule_case(ScheduleKind::gpipe, 1, 1);
  Batch b = batch();
  b["ids"] = zeros({3, 2}, DType::i64);  // not [kB, ...]
  GenericPipelineModel all(model(base), base.opts);
  EXPECT_THROW(all.run_train(b), ShapeError);
  GenericPipelineOptions o = base.opts;
  o.input_names = {"x", "y"};
  GenericPipelineModel picked(model(base), o);
  const double with_ids = picked.run_train(b).loss.item();
  b.erase("ids");
  EXPECT_EQ(with_ids, picked.run_train(b).loss.item());
}

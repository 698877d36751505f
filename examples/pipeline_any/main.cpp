// pipeline_any: a user's own model that is not a decoder — a residual MLP regressor — trained with
// pipeline parallelism through NxD's API (NxD's NxDPPModel for any module), at pipeline 2 x tensor
// parallel 2 x data parallel 2, and checked against the same training on one rank:
//   nxd-example-pipeline-any                  8 ranks on the sim backend (threads)
//   mpirun -np 8 nxd-example-pipeline-any     one rank per process
// The model is a pipeline::PipelineSequential: its pieces in order (an input projection, four
// residual blocks from NxD's Column/RowParallelLinear, an output projection) and how each runs.
// The pipeline cuts it between the blocks (transformer_layer_cls "ResidualBlock"), the loss is the
// user's (a LossSpec's loss_fn: mean squared error of the last stage's output against the batch's
// "y"), the model is built on the meta device (each rank materializes only its stage's pieces).
// Prints the first and last loss of both runs and their largest relative difference; exits 1 if
// the runs differ by more than 1e-4 relative or the loss did not fall fourfold, 2 on a user error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "nxd/api/nxd_api.h"
#include "nxd/collectives/mpi/mpi.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/basic.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/pipeline/sequential.h"
#include "nxd/runtime/init.h"

using namespace nxd;
using pipeline::Batch;

constexpr int64_t kIn = 8, kHidden = 32, kRows = 32;  // kRows: the global batch
constexpr int kBlocks = 4, kSteps = 40, kMicrobatches = 4, kTp = 2, kPp = 2, kDp = 2;
constexpr uint64_t kSeed = 7;
constexpr double kLr = 1e-2;

// x + fc2(gelu(fc1(x))): the hidden columns split over TP, the row layer sums them.
struct ResidualBlock : Module {
  std::shared_ptr<ColumnParallelLinear> fc1;
  std::shared_ptr<RowParallelLinear> fc2;
  ResidualBlock(int64_t h, ParamOptions po) : Module("ResidualBlock") {
    ColumnParallelLinearOptions c;
    c.gather_output = false;
    c.param = po;
    RowParallelLinearOptions r;
    r.input_is_parallel = true;
    r.param = po;
    fc1 = register_module("fc1", std::make_shared<ColumnParallelLinear>(h, 4 * h, c));
    fc2 = register_module("fc2", std::make_shared<RowParallelLinear>(4 * h, h, r));
  }
  Tensor forward(const Tensor& x) const { return add(x, fc2->forward(gelu(fc1->forward(x)))); }
};

std::shared_ptr<pipeline::PipelineSequential> regressor(const ParamOptions& po) {
  auto net = std::make_shared<pipeline::PipelineSequential>("Regressor");
  LinearOptions lo;
  lo.param = po;
  net->add_piece("inp", std::make_shared<Linear>(kIn, kHidden, lo),
                 [](Linear& l, const Tensor&, const Batch& mb) { return l.forward(mb.at("x")); });
  for (int i = 0; i < kBlocks; ++i)
    net->add_piece("block" + std::to_string(i), std::make_shared<ResidualBlock>(kHidden, po),
                   [](ResidualBlock& b, const Tensor& x, const Batch&) { return b.forward(x); });
  net->add_piece("out", std::make_shared<Linear>(kHidden, kIn, lo),
                 [](Linear& l, const Tensor& x, const Batch&) { return l.forward(x); });
  return net;
}

Tensor mse(const std::vector<Tensor>& outputs, const Batch& mb) {
  return mean(square(sub(outputs.at(0), mb.at("y"))));
}

// Step s's global batch: y = tanh(x W) for a fixed W.
Batch batch(int step) {
  Tensor w = zeros({kIn, kIn}), x = zeros({kRows, kIn});
  init::normal(w, RngStream{42, 1}, 0.0, 1.0);
  init::normal(x, RngStream{42, 100 + static_cast<uint64_t>(step)}, 0.0, 1.0);
  return {{"x", x}, {"y", tanh(matmul(x, w))}};
}
Batch rows(const Batch& b, int64_t begin, int64_t n) {
  Batch out;
  for (const auto& [k, t] : b) out[k] = t.narrow(0, begin, n).contiguous();
  return out;
}

// One rank, no parallelism: the whole model, each step accumulating the DP ranks' microbatches.
std::vector<double> one_rank_losses() {
  auto net = regressor({});
  net->init_parameters(kSeed);  // the values meta_device_init materializes by name
  std::vector<optim::NamedParam> params;
  for (auto& [n, t] : net->named_parameters()) params.push_back({n, t});
  optim::AdamW opt(optim::default_param_groups(params, kLr, 0.0));
  std::vector<double> losses;
  const int n = kDp * kMicrobatches;
  for (int s = 0; s < kSteps; ++s) {
    const Batch b = batch(s);
    double loss = 0;
    for (int i = 0; i < n; ++i) {
      const Batch mb = rows(b, i * (kRows / n), kRows / n);
      Tensor l = mul(mse(net->forward(mb), mb), 1.0 / n);
      backward(l);
      loss += l.item();
    }
    losses.push_back(loss);
    opt.step();
    net->zero_grad();
  }
  return losses;
}

struct Run {
  std::vector<double> pipelined, one_rank;
  std::string stages;
};

Run train() {
  Run run;
  run.one_rank = one_rank_losses();  // before the parallel state: a one-rank model
  api::NxDConfig want;
  want.tensor_parallel_size = kTp;
  want.pipeline_parallel_size = kPp;
  want.pipeline_config.num_microbatches = kMicrobatches;
  want.optimizer_config.grad_clipping = false;
  want.model_init_config.meta_device_init = true;
  want.model_init_config.seed = kSeed;
  const auto cfg = api::neuronx_distributed_config(want);
  pipeline::GenericPipelineOptions po;
  po.transformer_layer_cls = "ResidualBlock";
  po.loss.loss_fn = mse;
  auto model = api::initialize_parallel_model(cfg, regressor, po);
  auto opt = api::initialize_parallel_optimizer(
      cfg, *model, optim::default_param_groups(model->local_named_parameters(), kLr, 0.0),
      optim::AdamWOptions{});
  const int64_t per = kRows / parallel_state::get_data_parallel_size();
  const int64_t d = parallel_state::get_data_parallel_rank();
  for (int s = 0; s < kSteps; ++s) {
    // the loss comes back on every rank: the mean over microbatches and DP ranks
    run.pipelined.push_back(model->run_train(rows(batch(s), d * per, per)).loss.item());
    opt->step();
    opt->zero_grad();
  }
  run.stages = model->generic_pipeline()->partition_report();
  return run;
}

int main(int argc, char** argv) {
  try {
    Run r;
    bool report = true;
    if (mpi::under_launcher()) {
      mpi::Session session(&argc, &argv);
      r = train();
      report = session.rank() == 0;
    } else {
      sim::launch(kTp * kPp * kDp, [&] {
        Run mine = train();
        if (current_context().rank() == 0) r = std::move(mine);
      });
    }
    double worst = 0;
    for (int s = 0; s < kSteps; ++s)
      worst = std::max(worst, std::abs(r.pipelined[s] - r.one_rank[s]) / std::abs(r.one_rank[s]));
    if (report)
      std::printf(
          "%spipeline_any (pp=%d tp=%d dp=%d): loss %.5f -> %.5f, one rank %.5f -> %.5f, "
          "largest relative difference %.3g\n",
          r.stages.c_str(), kPp, kTp, kDp, r.pipelined.front(), r.pipelined.back(),
          r.one_rank.front(), r.one_rank.back(), worst);
    return worst <= 1e-4 && r.pipelined.back() < r.pipelined.front() / 4 ? 0 : 1;
  } catch (const UserError& e) {
    std::fprintf(stderr, "pipeline_any: error: %s\n", e.what());
    return 2;
  }
}

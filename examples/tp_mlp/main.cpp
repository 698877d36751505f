// tp_mlp: a user's own two-layer MLP from NxD's parallel layers (ColumnParallelLinear -> GELU ->
// RowParallelLinear), fit to a fixed nonlinear target with NxD's config and optimizer wrapper
// (api/nxd_api.h) at tensor parallel 2 x data parallel (world / 2):
//   nxd-example-tp-mlp [--zero1]                  4 ranks on the sim backend (threads)
//   mpirun -np 2 nxd-example-tp-mlp [--zero1]     one rank per process
// Every rank sees its own data; the wrapper averages gradients over DP (or shards AdamW's state
// with --zero1), sums nothing else by hand, and clips by the global norm. Prints the first and
// last loss; exits 1 if the loss did not fall tenfold, 2 on a user error.
#include <cstdio>
#include <cstring>
#include <memory>

#include "nxd/api/nxd_api.h"
#include "nxd/collectives/mpi/mpi.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/runtime/init.h"

using namespace nxd;

struct Mlp : Module {
  std::shared_ptr<ColumnParallelLinear> fc1;
  std::shared_ptr<RowParallelLinear> fc2;
  Mlp(int64_t in, int64_t hidden, int64_t out) : Module("Mlp") {
    ColumnParallelLinearOptions c;
    c.gather_output = false;  // each rank keeps its hidden columns
    RowParallelLinearOptions r;
    r.input_is_parallel = true;  // ... and the row layer sums the partial products
    fc1 = register_module("fc1", std::make_shared<ColumnParallelLinear>(in, hidden, c));
    fc2 = register_module("fc2", std::make_shared<RowParallelLinear>(hidden, out, r));
    init_parameters(7);  // by name: the same weights at any TP degree
  }
  Tensor forward(const Tensor& x) const { return fc2->forward(gelu(fc1->forward(x))); }
};

Tensor normal(const Shape& s, uint64_t stream) {
  Tensor t = zeros(s);
  init::normal(t, RngStream{42, stream}, 0.0, 1.0);
  return t;
}

// Trains on the current rank; returns {first loss, last loss} (the global batch's mean).
std::pair<double, double> train(bool zero1) {
  api::NxDConfig want;
  want.tensor_parallel_size = 2;
  want.optimizer_config.zero_one_enabled = zero1;
  const auto cfg = api::neuronx_distributed_config(want);
  Mlp model(16, 64, 4);
  std::vector<optim::NamedParam> params;
  for (auto& [n, t] : model.named_parameters()) params.push_back({n, t});
  auto opt = api::initialize_parallel_optimizer(
      cfg, model, optim::default_param_groups(params, 3e-2, 0.0), optim::AdamWOptions{});
  const int dp = parallel_state::get_data_parallel_size();
  const int rank = parallel_state::get_data_parallel_rank();
  const Tensor target_w = normal({16, 4}, 1);
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    Tensor x = normal({32, 16}, 1000 + static_cast<uint64_t>(step * dp + rank));
    Tensor y = tanh(matmul(x, target_w));
    Tensor loss = mean(square(sub(model.forward(x), y)));
    backward(loss);
    opt->step();
    opt->zero_grad();
    double l = loss.item();  // this DP rank's; the global batch's mean is the average
    parallel_state::get_data_parallel_group().all_reduce(&l, &l, 1, DType::f64, ReduceOp::avg);
    (step == 0 ? first : last) = l;
  }
  return {first, last};
}

int main(int argc, char** argv) {
  const bool zero1 = argc > 1 && std::strcmp(argv[1], "--zero1") == 0;
  try {
    std::pair<double, double> r;
    bool report = true;
    if (mpi::under_launcher()) {
      mpi::Session session(&argc, &argv);
      r = train(zero1);
      report = session.rank() == 0;
    } else {
      sim::launch(4, [&] {
        auto mine = train(zero1);
        if (current_context().rank() == 0) r = mine;
      });
    }
    if (report)
      std::printf("tp_mlp%s: loss %.5f -> %.5f\n", zero1 ? " (ZeRO-1)" : "", r.first, r.second);
    return r.second < r.first / 10 ? 0 : 1;
  } catch (const UserError& e) {
    std::fprintf(stderr, "tp_mlp: error: %s\n", e.what());
    return 2;
  }
}

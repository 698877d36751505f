// manual_optimization: the Neuron-PT-Lightning developer guide's manual-optimization training
// step in C++, on nxd's Lightning-style Trainer (trainer/trainer.h, trainer/manual.h). The module
// sets automatic_optimization = false and does what NeuronLTModule's training_step does: divides
// each micro batch's loss by grad_accum_steps, calls manual_backward, and every grad_accum_steps
// micro batches reduces its loss over DP, clips the gradients, steps the optimizer, zeroes the
// gradients and steps the LR scheduler; on_train_batch_end logs the reduced loss.
//   nxd-example-manual-optimization           4 ranks on the sim backend (threads)
//   mpirun -np 4 nxd-example-manual-optimization
// The model is a user's own: an embedding, then NxD's ColumnParallelLinear -> GELU ->
// RowParallelLinear and a head, at tensor parallel 2 x data parallel 2 with ZeRO-1, learning a
// counting sequence (each token is the previous one plus one). Prints the first and last loss;
// exits 1 unless the loss fell tenfold, 2 on a user error.
#include <cstdio>
#include <memory>

#include "nxd/collectives/mpi/mpi.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/basic.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/runtime/rng.h"
#include "nxd/trainer/trainer.h"

using namespace nxd;
using namespace nxd::trainer;

constexpr int64_t kVocab = 32, kSeq = 16, kGradAccumSteps = 2;

// Sample i counts up from a seeded start: s, s+1, s+2, ... (mod kVocab).
class CountingDataset : public Dataset {
 public:
  int64_t size() const override { return 512; }
  int64_t seq_length() const override { return kSeq; }
  void get(int64_t i, int64_t* out) const override {
    const auto start = static_cast<int64_t>(RngStream{7, 0}.uniform_f64(static_cast<uint64_t>(i)) *
                                            static_cast<double>(kVocab));
    for (int64_t k = 0; k <= kSeq; ++k) out[k] = (start + k) % kVocab;
  }
};

struct CounterNet : Module {
  std::shared_ptr<Embedding> embed;
  std::shared_ptr<ColumnParallelLinear> up;
  std::shared_ptr<RowParallelLinear> down;
  std::shared_ptr<Linear> head;
  CounterNet() : Module("CounterNet") {
    embed = register_module("embed", std::make_shared<Embedding>(kVocab, 32));
    ColumnParallelLinearOptions c;
    c.gather_output = false;
    RowParallelLinearOptions r;
    r.input_is_parallel = true;
    up = register_module("up", std::make_shared<ColumnParallelLinear>(32, 128, c));
    down = register_module("down", std::make_shared<RowParallelLinear>(128, 32, r));
    head = register_module("head", std::make_shared<Linear>(32, kVocab));
    init_parameters(11);  // by name: the same weights at any TP degree
  }
  Tensor loss(const Batch& b) const {
    Tensor h = embed->forward(b.ids);                                    // [B, S, 32]
    Tensor logits = head->forward(down->forward(gelu(up->forward(h))));  // [B, S, V]
    return cross_entropy(reshape(logits, {-1, kVocab}), b.targets.reshape({-1}));
  }
};

class CounterModule : public TrainingModule {
 public:
  CounterModule() { automatic_optimization = false; }  // NeuronLTModule's manual_opt = True
  double first_loss = -1, last_loss = -1;

  std::shared_ptr<Module> build_model() override { return std::make_shared<CounterNet>(); }

  OptimizerSetup configure_optimizers() override {
    OptimizerSetup s;
    s.optimizer = std::make_unique<optim::AdamW>(
        param_groups_by_weight_decay(local_parameters(), 1e-2, 0.01),
        optim::AdamWOptions{.defer_state = true});  // ZeRO-1 replaces it: no full-size state
    s.schedule = optim::LRSchedule({.kind = optim::ScheduleKind::cosine,
                                    .lr = 1e-2,
                                    .min_lr = 1e-3,
                                    .warmup_steps = 5,
                                    .decay_steps = 60});
    return s;
  }

  // The guide's training_step.
  Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    should_print_ = false;
    Tensor loss =
        static_cast<CounterNet&>(model()).loss(batch) / static_cast<double>(kGradAccumSteps);
    manual_backward(loss);
    averaged_loss_ += loss.item();
    if ((batch_idx + 1) % kGradAccumSteps == 0) {
      should_print_ = true;
      double loss_reduced = averaged_loss_ / parallel_state::get_data_parallel_size();
      parallel_state::get_data_parallel_group().all_reduce(&loss_reduced, &loss_reduced, 1,
                                                           DType::f64, ReduceOp::sum);
      averaged_loss_ = 0;
      ManualOptimizer& optimizer = optimizers();
      LRScheduler& scheduler = lr_schedulers();
      clip_gradients(1.0);
      optimizer.step();
      optimizer.zero_grad();
      scheduler.step();
      loss_ = loss_reduced;
    }
    return loss;
  }

  void on_train_batch_end(const StepOutput&) override {
    if (!should_print_) return;
    trainer().log("loss", loss_);
    if (first_loss < 0) first_loss = loss_;
    last_loss = loss_;
  }

 private:
  double averaged_loss_ = 0, loss_ = 0;
  bool should_print_ = false;
};

// Trains on the current rank; returns {first loss, last loss} of the global batch.
std::pair<double, double> train() {
  TrainerOptions to;
  to.nxd.tensor_parallel_size = 2;
  to.nxd.optimizer_config.zero_one_enabled = true;
  to.max_steps = 60;
  to.log_every_n_steps = 20;
  DatasetDataModule data(std::make_shared<CountingDataset>(), nullptr,
                         {.micro_batch_size = 4, .seed = 3});
  CounterModule module;
  Trainer(to).fit(module, data);
  return {module.first_loss, module.last_loss};
}

int main(int argc, char** argv) {
  try {
    std::pair<double, double> r;
    bool report = true;
    if (mpi::under_launcher()) {
      mpi::Session session(&argc, &argv);
      r = train();
      report = session.rank() == 0;
    } else {
      sim::launch(4, [&] {
        auto mine = train();
        if (current_context().rank() == 0) r = mine;
      });
    }
    if (report) std::printf("manual_optimization: loss %.5f -> %.5f\n", r.first, r.second);
    return r.second < r.first / 10 ? 0 : 1;
  } catch (const UserError& e) {
    std::fprintf(stderr, "manual_optimization: error: %s\n", e.what());
    return 2;
  }
}

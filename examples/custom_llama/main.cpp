// custom_llama: a researcher's own Llama-style model class (not nxd's CausalLM) from NxD's
// parallel layers, trained with NxD's wrappers at TP2 x DP2, ZeRO-1, bf16 mixed precision, meta
// init: `nxd-example-custom-llama` (4 sim ranks) or `mpirun -np 4 nxd-example-custom-llama`.
// Task: continue arithmetic progressions mod 64. Exit 1 unless the loss halves, 2 on user errors.
#include <cstdio>

#include "nxd/api/nxd_api.h"
#include "nxd/collectives/mpi/mpi.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/parallel/cross_entropy.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/transformer.h"

using namespace nxd;
constexpr int64_t kVocab = 64, kHidden = 64, kHeads = 4, kLayers = 2, kSeq = 32;

struct Block : Module {
  std::shared_ptr<RMSNorm> ln1, ln2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<GatedMlp> mlp;
  explicit Block(const ParamOptions& po) : Module("Block") {
    ln1 = register_module("ln1", std::make_shared<RMSNorm>(kHidden, RMSNormOptions{.param = po}));
    AttentionOptions ao{.hidden_size = kHidden, .num_heads = kHeads, .param = po};
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(ao));
    ln2 = register_module("ln2", std::make_shared<RMSNorm>(kHidden, RMSNormOptions{.param = po}));
    GatedMlpOptions mo{.param = po};
    mlp = register_module("mlp", std::make_shared<GatedMlp>(kHidden, 4 * kHidden, mo));
  }
  Tensor forward(const Tensor& x) const {
    Tensor h = add(x, attn->forward(ln1->forward(x)));
    return add(h, mlp->forward(ln2->forward(h)));
  }
};

struct MyLlama : Module {
  std::shared_ptr<ParallelEmbedding> embed;
  std::vector<std::shared_ptr<Block>> blocks;
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<ColumnParallelLinear> head;
  explicit MyLlama(const ParamOptions& po) : Module("MyLlama") {
    embed = register_module("embed", std::make_shared<ParallelEmbedding>(
                                         kVocab, kHidden, ParallelEmbeddingOptions{.param = po}));
    for (int i = 0; i < kLayers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), std::make_shared<Block>(po)));
    norm = register_module("norm", std::make_shared<RMSNorm>(kHidden, RMSNormOptions{.param = po}));
    ColumnParallelLinearOptions ho{.bias = false, .gather_output = false, .param = po};
    head = register_module("head", std::make_shared<ColumnParallelLinear>(kHidden, kVocab, ho));
  }
  // Mean next-token cross entropy over the vocabulary-parallel logits (never gathered).
  Tensor loss(const Tensor& ids, const Tensor& targets) const {
    Tensor h = embed->forward(ids);
    for (const auto& b : blocks) h = b->forward(h);
    return parallel_cross_entropy(head->forward(norm->forward(h)), targets,
                                  {.reduction = Reduction::mean});
  }
};

// Batch `step` of DP rank `r`: rows x_{t+1} = (x_t + d) mod 64, random start and d.
std::pair<Tensor, Tensor> batch(int step, int r) {
  std::vector<int64_t> ids(8 * kSeq), tg(8 * kSeq);
  RngStream s{99, static_cast<uint64_t>(step * 16 + r)};
  for (int64_t row = 0; row < 8; ++row) {
    const int64_t x0 = s.uniform_f64(2 * row) * kVocab, d = 1 + s.uniform_f64(2 * row + 1) * 5;
    for (int64_t t = 0; t < kSeq; ++t)
      ids[row * kSeq + t] = (x0 + d * t) % kVocab, tg[row * kSeq + t] = (x0 + d * t + d) % kVocab;
  }
  return {from_vector<int64_t>(ids, {8, kSeq}), from_vector<int64_t>(tg, {8, kSeq})};
}

std::pair<double, double> train() {
  const auto cfg = api::neuronx_distributed_config(api::NxDConfig::from_json(
      {{"tensor_parallel_size", 2},
       {"precision", "mixed_precision"},
       {"optimizer_config", {{"zero_one_enabled", true}}},
       {"model_init_config", {{"meta_device_init", true}, {"seed", 5}}}}));
  auto model = api::initialize_parallel_model(cfg, [](const ParamOptions& po) {
    return std::make_shared<MyLlama>(po);  // on the meta device in bf16: materialized after
  });
  auto opt = api::initialize_parallel_optimizer(
      cfg, *model, optim::default_param_groups(model->local_named_parameters(), 1e-2, 0.01),
      optim::AdamWOptions{});
  const int dp_rank = parallel_state::get_data_parallel_rank();
  double first = 0, last = 0;
  for (int step = 0; step < 80; ++step) {
    auto [ids, tg] = batch(step, dp_rank);
    Tensor loss =
        model->run_train([&](Module& m) { return static_cast<MyLlama&>(m).loss(ids, tg); });
    opt->step();
    opt->zero_grad();
    double l = loss.item();  // this DP rank's batch: the global batch's mean is the average
    parallel_state::get_data_parallel_group().all_reduce(&l, &l, 1, DType::f64, ReduceOp::avg);
    (step == 0 ? first : last) = l;
  }
  return {first, last};
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
    if (report) std::printf("custom_llama: loss %.4f -> %.4f\n", r.first, r.second);
    return r.second < r.first / 2 ? 0 : 1;
  } catch (const UserError& e) {
    std::fprintf(stderr, "custom_llama: error: %s\n", e.what());
    return 2;
  }
}

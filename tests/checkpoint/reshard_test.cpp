// Resharding: the split arithmetic agrees with the parallel layers' own layout (strided fused
// weights, replicated K/V), and a checkpoint saved at TP = 1, 2 or 4 loads at TP = 1, 2 or 4:
// every parameter and optimizer state tensor is bitwise its block of the full tensor, and the
// loaded model computes the saved model's loss within 1e-6.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>

#include "ckpt_util.h"
#include "nxd/checkpoint/reshard.h"
#include "nxd/layers/parallel/layers.h"
#include "support/files.h"
#include "support/ranks.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
using nxd::testing::run_ranks;
using nxd::testing::Trainee;

TEST(Reshard, SplitArithmeticMatchesStridedColumnParallelLinear) {
  ColumnParallelLinearOptions o;
  o.stride = 2;
  o.gather_output = false;
  o.weight_init = ParamInit::normal(1.0);
  o.bias_init = ParamInit::normal(1.0);
  ColumnParallelLinear full(6, 8, o);
  full.init_parameters(3);
  std::mutex mu;
  run_ranks(2, [&] {
    parallel_state::initialize_model_parallel(2);
    ColumnParallelLinear l(6, 8, o);
    l.init_parameters(3);
    const int r = parallel_state::get_tensor_model_parallel_rank();
    for (const auto& p : parallel_parameters(l)) {
      const ShardSpec s = shard_spec(p.attrs);
      std::lock_guard<std::mutex> g(mu);
      ASSERT_TRUE(s.split) << p.name;
      EXPECT_EQ(s.stride, 2);
      const Tensor f = full.get_parameter(p.name).detach();
      EXPECT_EQ(full_shape(p.tensor.shape(), s), f.shape()) << p.name;
      EXPECT_EQ(local_shape(f.shape(), s, p.name), p.tensor.shape()) << p.name;
      EXPECT_BITWISE_EQ(p.tensor.detach(), shard_view(f, s, r).contiguous());
    }
  });
  // replicated K/V: 4 ranks, 2 blocks, ranks 0,1 hold block 0
  const ShardSpec kv{true, 0, 1, 4, 2};
  EXPECT_EQ(full_shape({3, 5}, kv), (Shape{6, 5}));
  EXPECT_EQ(covering_ranks(kv), (std::vector<int64_t>{0, 2}));
  Tensor f = arange(0, 30, 1).view({6, 5});
  EXPECT_BITWISE_EQ(shard_view(f, kv, 1).contiguous(), f.narrow(0, 0, 3).contiguous());
  EXPECT_BITWISE_EQ(shard_view(f, kv, 2).contiguous(), f.narrow(0, 3, 3).contiguous());
  EXPECT_THROW(local_shape({5, 5}, kv, "x"), ShapeError);
}

// Per tensor name ("m:" / "o:" prefixed as snapshot()), its split on a model at some TP.
std::map<std::string, ShardSpec> specs_of(Module& m, const optim::Optimizer& o) {
  std::map<std::string, ShardSpec> s, out;
  for (const auto& p : parallel_parameters(m)) s[p.name] = shard_spec(p.attrs);
  for (const auto& [n, t] : m.state_dict()) out["m:" + n] = s.count(n) ? s[n] : ShardSpec{};
  for (const auto& [n, t] : o.state_tensors()) {
    const auto p = n.substr(0, n.rfind('.'));
    out["o:" + n] = s.count(p) && t.dim() > 0 ? s[p] : ShardSpec{};
  }
  return out;
}

struct Saved {
  double loss = 0;                                     // eval loss of the saved model
  std::map<int, std::map<std::string, Tensor>> local;  // per TP rank
  std::map<int, std::map<std::string, ShardSpec>> spec;
};

Saved save_at(int tp, const fs::path& dir) {
  Saved s;
  std::mutex mu;
  run_ranks(tp, [&] {
    parallel_state::initialize_model_parallel(tp);
    Trainee t(tp);
    t.step(0);
    t.step(1);
    const double loss = t.eval_loss();
    save_checkpoint(dir, "t", t.model.get(), t.opt.get(), t.sched.get());
    std::lock_guard<std::mutex> g(mu);
    const int r = parallel_state::get_tensor_model_parallel_rank();
    s.loss = loss;
    s.local[r] = nxd::testing::snapshot(*t.model, t.opt.get());
    s.spec[r] = specs_of(*t.model, *t.opt);
  });
  return s;
}

void expect_blocks_of(const std::map<std::string, Tensor>& local,
                      const std::map<std::string, ShardSpec>& spec,
                      const std::map<std::string, Tensor>& full, int rank,
                      const std::string& what) {
  ASSERT_EQ(local.size(), full.size()) << what;
  for (const auto& [n, t] : local)
    EXPECT_TRUE(nxd::testing::bitwise_equal(
        t, shard_view(full.at(n), spec.at(n), rank).contiguous(), what + " " + n));
}

TEST(Reshard, TpOneTwoFourInEveryDirection) {
  const nxd::testing::ScratchDir root_scratch("nxd_reshard_");
  const fs::path& root = root_scratch.path;
  for (int a : {1, 2, 4}) {
    const fs::path dir = root / ("tp" + std::to_string(a));
    const Saved saved = save_at(a, dir);
    // the full tensors, loaded at TP 1; every saved shard is its block of them
    Trainee one(1, 5);
    load_checkpoint(dir, one.model.get(), one.opt.get(), one.sched.get());
    const auto full = nxd::testing::snapshot(*one.model, one.opt.get());
    for (const auto& [r, loc] : saved.local)
      expect_blocks_of(loc, saved.spec.at(r), full, r,
                       "saved TP" + std::to_string(a) + " rank " + std::to_string(r));
    for (int b : {1, 2, 4}) {
      const std::string what = "TP" + std::to_string(a) + "->TP" + std::to_string(b);
      std::mutex mu;
      run_ranks(b, [&] {
        parallel_state::initialize_model_parallel(b);
        Trainee t(b, 5);
        load_checkpoint(dir, t.model.get(), t.opt.get(), t.sched.get());
        const int r = parallel_state::get_tensor_model_parallel_rank();
        const double loss = t.eval_loss();
        EXPECT_EQ(t.opt->steps(), 2) << what;
        std::lock_guard<std::mutex> g(mu);
        expect_blocks_of(nxd::testing::snapshot(*t.model, t.opt.get()), specs_of(*t.model, *t.opt),
                         full, r, what + " rank " + std::to_string(r));
        EXPECT_LE(std::abs(loss - saved.loss), 1e-6 * std::abs(saved.loss))
            << what << ": loss " << loss << " vs saved " << saved.loss;
      });
    }
  }
}

}  // namespace
}  // namespace nxd::ckpt

// SaveOptions::down_cast_bf16 (NxD's down_cast_bf16, NxD Training's exp_manager.save_bf16): the
// model's weights written in bf16, the optimizer state (f32 masters included) as held; the
// checkpoint loads into f32 runs (the bf16 values, exactly) and bf16 runs, at the saved TP degree
// and another one, and a mixed-precision run resumes from it bitwise.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>

#include "support/files.h"
#include "support/ranks.h"
#include "zero1_util.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
using nxd::testing::run_ranks;
using nxd::testing::Trainee;

int64_t folder_bytes(const fs::path& p) {
  int64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(p))
    if (e.is_regular_file()) n += static_cast<int64_t>(e.file_size());
  return n;
}

// Every model tensor of `m` (the whole model: TP 1), as `dtype`.
std::map<std::string, Tensor> weights(const Module& m, DType dtype) {
  std::map<std::string, Tensor> w;
  for (const auto& [n, t] : m.state_dict()) w[n] = t.detach().to(dtype).clone();
  return w;
}

}  // namespace

TEST(Bf16Save, ModelInBf16OptimizerAsHeldLoadsIntoF32AndBf16Runs) {
  const nxd::testing::ScratchDir dir("nxd_bf16save_");
  std::map<std::string, Tensor> saved_optim;
  run_ranks(2, [&] {  // TP 2
    parallel_state::initialize_model_parallel(2);
    Trainee t(2);
    for (int s = 0; s < 3; ++s) t.step(s);
    save_checkpoint(dir.path, "f32", t.model.get(), t.opt.get(), t.sched.get());
    save_checkpoint(dir.path, "bf16", t.model.get(), t.opt.get(), t.sched.get(), nullptr,
                    {.down_cast_bf16 = true});
    // at TP 2 again: the model's tensors are the bf16 values, the optimizer's bitwise
    Trainee back(2, 7);
    load_checkpoint(dir.path, back.model.get(), back.opt.get(), back.sched.get(), {.tag = "bf16"});
    for (const auto& [n, w] : t.model->state_dict())
      EXPECT_TRUE(nxd::testing::bitwise_equal(back.model->state_dict().at(n),
                                              w.detach().to(DType::bf16).to(w.dtype()), n));
    for (size_t i = 0; i < t.opt->state_tensors().size(); ++i)
      EXPECT_TRUE(nxd::testing::bitwise_equal(back.opt->state_tensors()[i].second,
                                              t.opt->state_tensors()[i].second,
                                              t.opt->state_tensors()[i].first));
  });
  const auto meta = read_metadata(dir.path / "bf16");
  int bf16_tensors = 0;
  for (const auto& [n, e] : meta["model"].items()) bf16_tensors += e["dtype"] == "BF16";
  EXPECT_EQ(bf16_tensors, static_cast<int>(meta["model"].size()));
  for (const auto& [n, e] : meta["optimizer"]["tensors"].items())
    EXPECT_NE(e["dtype"], "BF16") << n;
  const int64_t f32_bytes = folder_bytes(dir.path / "f32" / "model");
  const int64_t bf16_bytes = folder_bytes(dir.path / "bf16" / "model");
  std::printf("    model files: f32 %lld bytes, bf16 %lld bytes\n",
              static_cast<long long>(f32_bytes), static_cast<long long>(bf16_bytes));
  EXPECT_LT(bf16_bytes, f32_bytes * 6 / 10);

  // at TP 1 (the shards gathered, then converted): into f32 the bf16 values of the f32 save,
  // into a bf16 model the same values
  run_ranks(1, [&] {
    parallel_state::initialize_model_parallel(1);
    Trainee whole(1, 3), from_bf16(1, 5);
    load_checkpoint(dir.path, whole.model.get(), nullptr, nullptr, {.tag = "f32"});
    load_checkpoint(dir.path, from_bf16.model.get(), nullptr, nullptr, {.tag = "bf16"});
    const auto want = weights(*whole.model, DType::bf16);
    for (const auto& [n, w] : from_bf16.model->state_dict())
      EXPECT_TRUE(nxd::testing::bitwise_equal(w.detach(), want.at(n).to(DType::f32), n));
    ModelConfig c = nxd::testing::ckpt_model_config(1);
    c.dtype = DType::bf16;
    auto bf = make_causal_lm(c, 9);
    load_checkpoint(dir.path, bf.get(), nullptr, nullptr, {.tag = "bf16"});
    for (const auto& [n, w] : bf->state_dict())
      if (is_floating(w.dtype()))
        EXPECT_TRUE(nxd::testing::bitwise_equal(w.detach(), want.at(n), n));
  });
}

// Mixed precision (bf16 parameters, f32 masters): a down-cast save keeps the masters in f32, so
// the run resumes from it bitwise.
TEST(Bf16Save, MixedPrecisionResumesBitwiseWithF32Masters) {
  const nxd::testing::ScratchDir dir("nxd_bf16save_");
  std::vector<double> whole, resumed;
  run_ranks(1, [&] {
    parallel_state::initialize_model_parallel(1);
    nxd::testing::Zero1Trainee t(1, {.bf16 = true});
    for (int s = 0; s < 3; ++s) t.step(s, {0, 1});
    save_checkpoint(dir.path, "step_3", t.model.get(), t.opt.get(), t.sched.get(), nullptr,
                    {.down_cast_bf16 = true});
    for (int s = 3; s < 6; ++s) {
      t.step(s, {0, 1});
      whole.push_back(t.eval_loss());
    }
    nxd::testing::Zero1Trainee r(1, {.seed = 7, .bf16 = true});
    load_checkpoint(dir.path, r.model.get(), r.opt.get(), r.sched.get());
    for (int s = 3; s < 6; ++s) {
      r.step(s, {0, 1});
      resumed.push_back(r.eval_loss());
    }
  });
  const auto meta = read_metadata(dir.path / "step_3");
  int masters = 0;
  for (const auto& [n, e] : meta["optimizer"]["tensors"].items())
    if (n.ends_with(".master")) masters += e["dtype"] == "F32";
  EXPECT_GT(masters, 0) << "the masters are saved in f32";
  for (const auto& [n, e] : meta["model"].items()) EXPECT_EQ(e["dtype"], "BF16") << n;
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed[i], whole[i]) << "step " << i + 4;
}

}  // namespace nxd::ckpt

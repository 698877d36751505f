// ZeRO-1 checkpoints: every DP rank writes its own part of the optimizer state (no gather: the
// save allocates nothing the size of the state), a round trip at the same degrees is bitwise for
// every optimizer tensor, and the state reshards: ZeRO-1 DP 4 -> ZeRO-1 DP 2 and -> AdamW on one
// rank (the loaded model's loss equal within 1e-6, the next steps as the original's), AdamW ->
// ZeRO-1 (scattered). A checkpoint of the earlier layout (format 1: ZeRO-1 state gathered into
// AdamW's tensors by DP rank 0) still loads into both.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <mutex>

#include "nxd/checkpoint/offline.h"
#include "nxd/io/safetensors.h"
#include "support/files.h"
#include "support/ranks.h"
#include "zero1_util.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using nxd::testing::error_of;
using nxd::testing::full_state;
using nxd::testing::run_ranks;
using nxd::testing::shard_snapshot;
using nxd::testing::shards_of;
using nxd::testing::Zero1Trainee;

std::string optim_file(int dp, int tp) {
  char b[96];
  std::snprintf(b, sizeof b, "optim/dp_rank_%02d_tp_rank_%02d_pp_rank_00.safetensors", dp, tp);
  return b;
}

// Per DP rank a file holding that rank's part; the save allocates no state-sized tensor (the
// allocator's peak over the save is compared with what gathering the state needs).
TEST(Zero1Checkpoint, EveryDpRankWritesItsOwnPartWithoutGathering) {
  const nxd::testing::ScratchDir dir("nxd_z1ckpt_");
  std::mutex mu;
  int64_t worst_save = 0, gathered = 0, shard = 0;
  run_ranks(4, [&] {
    parallel_state::initialize_model_parallel(1);
    Zero1Trainee t(1, {.zero1 = true});
    for (int s = 0; s < 2; ++s) t.step(s, shards_of(parallel_state::get_data_parallel_rank(), 4));
    MemoryCounter& mem = current_context().memory();
    const int64_t before = mem.live();
    mem.reset_peak();
    save_checkpoint(dir.path, "t", t.model.get(), t.opt.get(), t.sched.get());
    const int64_t save_peak = mem.peak() - before;
    mem.reset_peak();
    t.zero1()->gather_state();  // what the earlier layout gathered on every rank
    const int64_t gather_peak = mem.peak() - before;
    t.zero1()->release_state();
    std::lock_guard<std::mutex> g(mu);
    worst_save = std::max(worst_save, save_peak);
    gathered = std::max(gathered, gather_peak);
    shard = t.opt->state_bytes();
  });
  std::printf(
      "    DP 4: state per rank %lld bytes; save peak %lld bytes per rank (gathering: %lld)\n",
      static_cast<long long>(shard), static_cast<long long>(worst_save),
      static_cast<long long>(gathered));
  EXPECT_LT(worst_save, shard / 10) << "the save allocated state-sized tensors";
  EXPECT_GT(gathered, 3 * shard);
  const json m = read_metadata(dir.path / "t");
  EXPECT_EQ(m["format_version"], 2);
  EXPECT_EQ(m["parallel"]["zero1"], true);
  int64_t elements = 0;
  for (int d = 0; d < 4; ++d) {
    ASSERT_TRUE(fs::exists(dir.path / "t" / optim_file(d, 0))) << d;
    ASSERT_TRUE(m["files"].contains(optim_file(d, 0))) << d;
    io::SafetensorsReader r(dir.path / "t" / optim_file(d, 0));
    EXPECT_EQ(r.header().metadata.count("nxd.zero1"), 1u);
    for (const auto& ti : r.header().tensors)
      if (ti.name.size() > 8 && ti.name.substr(ti.name.size() - 8) == ".exp_avg")
        elements += ti.shape.at(0);
  }
  // metadata lists whole tensors; the DP files' parts add up to them exactly
  int64_t whole = 0;
  for (const auto& [name, e] : m["optimizer"]["tensors"].items())
    if (name.size() > 8 && name.substr(name.size() - 8) == ".exp_avg") {
      int64_t n = 1;
      for (const auto& x : e["shape"]) n *= x.get<int64_t>();
      whole += n;
    }
  EXPECT_EQ(elements, whole);
  EXPECT_FALSE(fs::exists(dir.path / "t/model/dp_rank_01_tp_rank_00_pp_rank_00.safetensors"));
}

// Same degrees: every optimizer tensor bitwise, and the next step's loss bitwise (plain, zstd,
// async), at DP 2 and TP 2 x DP 2.
TEST(Zero1Checkpoint, RoundTripIsBitwiseAtTheSameDegrees) {
  const nxd::testing::ScratchDir dir("nxd_z1ckpt_");
  for (int tp : {1, 2}) {
    int n = 0;
    for (const SaveOptions& so :
         {SaveOptions{}, SaveOptions{.compress = true}, SaveOptions{.async_save = true}}) {
      const fs::path p = dir.path / ("tp" + std::to_string(tp) + "_" + std::to_string(n++));
      run_ranks(2 * tp, [&] {
        parallel_state::initialize_model_parallel(tp);
        const int d = parallel_state::get_data_parallel_rank();
        Zero1Trainee a(tp, {.zero1 = true});
        a.step(0, shards_of(d, 2));
        a.step(1, shards_of(d, 2));
        const auto state = shard_snapshot(*a.opt);
        const auto model = nxd::testing::snapshot(*a.model, nullptr);
        save_checkpoint(p, "t", a.model.get(), a.opt.get(), a.sched.get(), nullptr, so);
        a.step(2, shards_of(d, 2));  // an async save must not see this
        const double next = a.eval_loss();
        finalize_checkpoint();
        Zero1Trainee b(tp, {.zero1 = true, .seed = 9});
        load_checkpoint(p, b.model.get(), b.opt.get(), b.sched.get());
        nxd::testing::expect_same(shard_snapshot(*b.opt), state, "optimizer");
        nxd::testing::expect_same(nxd::testing::snapshot(*b.model, nullptr), model, "model");
        EXPECT_EQ(b.opt->steps(), 2);
        b.step(2, shards_of(d, 2));
        EXPECT_EQ(b.eval_loss(), next);
      });
    }
  }
}

struct Trained {
  double loss = 0;                      // eval loss when saved
  std::vector<double> after;            // eval loss after each later step
  std::map<std::string, Tensor> state;  // the full optimizer state when saved
};

// Trains 3 steps at DP 4 with ZeRO-1 (of AdamW, or of Lion), saves, continues 3 steps.
Trained train_dp4(const fs::path& dir, bool lion = false) {
  Trained run;
  std::mutex mu;
  run_ranks(4, [&] {
    parallel_state::initialize_model_parallel(1);
    const int d = parallel_state::get_data_parallel_rank();
    Zero1Trainee t(1, {.zero1 = true, .lion = lion});
    for (int s = 0; s < 3; ++s) t.step(s, shards_of(d, 4));
    const double loss = t.eval_loss();
    save_checkpoint(dir, "step_3", t.model.get(), t.opt.get(), t.sched.get());
    auto state = full_state(*t.opt);
    std::vector<double> after;
    for (int s = 3; s < 6; ++s) {
      t.step(s, shards_of(d, 4));
      after.push_back(t.eval_loss());
    }
    std::lock_guard<std::mutex> g(mu);
    if (d == 0) run = {loss, after, state};
  });
  return run;
}

double rel(double a, double b) {
  return std::abs(a - b) / std::abs(b);
}

struct Target {
  int dp = 1;
  bool zero1 = false;  // Zero1AdamW, else AdamW
  bool lion = false;   // Lion's rule and state instead of AdamW's
};

// Loads `dir` at the target's DP degree, checks the loss and full state, continues 3 steps.
void resume_at(const fs::path& dir, Target target, const Trained& orig, const std::string& what) {
  const int n = target.dp;
  const bool zero1 = target.zero1;
  std::mutex mu;
  double worst = 0;
  run_ranks(n, [&] {
    parallel_state::initialize_model_parallel(1);
    const int d = parallel_state::get_data_parallel_rank();
    Zero1Trainee t(1, {.zero1 = zero1, .seed = 7, .lion = target.lion});
    load_checkpoint(dir, t.model.get(), t.opt.get(), t.sched.get());
    const double loss = t.eval_loss();
    EXPECT_LE(rel(loss, orig.loss), 1e-6) << what << ": loss " << loss << " vs " << orig.loss;
    nxd::testing::expect_same(full_state(*t.opt), orig.state, what);
    double w = 0;
    for (int s = 3; s < 6; ++s) {
      t.step(s, shards_of(d, n));
      w = std::max(w, rel(t.eval_loss(), orig.after[static_cast<size_t>(s - 3)]));
    }
    std::lock_guard<std::mutex> g(mu);
    worst = std::max(worst, w);
  });
  std::printf("    %s: next 3 steps' losses within %.3g of the original's\n", what.c_str(), worst);
  EXPECT_LE(worst, 1e-5) << what;
}

TEST(Zero1Checkpoint, Dp4ToDp2AndToAdamWOnOneRank) {
  const nxd::testing::ScratchDir dir("nxd_z1ckpt_");
  const Trained orig = train_dp4(dir.path);
  ASSERT_EQ(orig.after.size(), 3u);
  EXPECT_NE(orig.after[2], orig.loss) << "the continued steps change nothing";
  resume_at(dir.path, {.dp = 2, .zero1 = true}, orig, "ZeRO-1 DP4 -> ZeRO-1 DP2");
  resume_at(dir.path, {.dp = 1, .zero1 = false}, orig, "ZeRO-1 DP4 -> AdamW DP1");
  resume_at(dir.path, {.dp = 4, .zero1 = true}, orig, "ZeRO-1 DP4 -> ZeRO-1 DP4");
}

// ZeRO-1 over Lion: the same per-rank files (exp_avg only), resharded as AdamW's.
TEST(Zero1Checkpoint, LionDp4ToDp2AndToLionOnOneRank) {
  const nxd::testing::ScratchDir dir("nxd_z1ckpt_");
  const Trained orig = train_dp4(dir.path, /*lion=*/true);
  const auto meta = read_metadata(dir.path / "step_3");
  EXPECT_EQ(meta["optimizer"]["info"]["kind"], "Lion");
  EXPECT_EQ(meta["optimizer"]["info"]["options"]["beta2"], 0.99);
  int moments = 0, second = 0;
  for (const auto& [name, t] : orig.state) {
    moments += name.ends_with(".exp_avg");
    second += name.ends_with(".exp_avg_sq");
  }
  EXPECT_GT(moments, 0);
  EXPECT_EQ(second, 0) << "Lion keeps one moment";
  EXPECT_NE(orig.after[2], orig.loss) << "the continued steps change nothing";
  resume_at(dir.path, {.dp = 2, .zero1 = true, .lion = true}, orig, "Lion ZeRO-1 DP4 -> DP2");
  resume_at(dir.path, {.dp = 1, .zero1 = false, .lion = true}, orig, "Lion ZeRO-1 DP4 -> Lion DP1");
  // the kind is checked: Lion's state does not load into AdamW
  run_ranks(1, [&] {
    parallel_state::initialize_model_parallel(1);
    Zero1Trainee t(1, {});
    try {
      load_checkpoint(dir.path, t.model.get(), t.opt.get(), t.sched.get());
      ADD_FAILURE() << "Lion's state loaded into AdamW";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("the optimizer state is Lion's"), std::string::npos)
          << e.what();
    }
  });
}

// AdamW's checkpoint (DP 2) into ZeRO-1 at DP 4: every rank takes its part of the whole state.
TEST(Zero1Checkpoint, AdamWIntoZero1) {
  const nxd::testing::ScratchDir dir("nxd_z1ckpt_");
  Trained orig;
  std::mutex mu;
  run_ranks(2, [&] {
    parallel_state::initialize_model_parallel(1);
    const int d = parallel_state::get_data_parallel_rank();
    Zero1Trainee t(1, {});
    for (int s = 0; s < 3; ++s) t.step(s, shards_of(d, 2));
    const double loss = t.eval_loss();
    save_checkpoint(dir.path, "step_3", t.model.get(), t.opt.get(), t.sched.get());
    auto state = full_state(*t.opt);
    std::vector<double> after;
    for (int s = 3; s < 6; ++s) {
      t.step(s, shards_of(d, 2));
      after.push_back(t.eval_loss());
    }
    std::lock_guard<std::mutex> g(mu);
    if (d == 0) orig = {loss, after, state};
  });
  EXPECT_EQ(read_metadata(dir.path / "step_3")["parallel"]["zero1"], false);
  EXPECT_EQ(read_metadata(dir.path / "step_3")["format_version"], 1);
  resume_at(dir.path, {.dp = 4, .zero1 = true}, orig, "AdamW DP2 -> ZeRO-1 DP4");
  resume_at(dir.path, {.dp = 2, .zero1 = true}, orig, "AdamW DP2 -> ZeRO-1 DP2");
}

// A checkpoint written by nxd before per-rank ZeRO-1 files (fixtures/v1_zero1_dp2: a ZeRO-1
// run at DP 2 whose state DP rank 0 saved gathered, format 1) loads into AdamW and into ZeRO-1,
// and both hold the same state.
TEST(Zero1Checkpoint, EarlierGatheredLayoutStillLoads) {
  const nxd::testing::ScratchDir dir("nxd_z1ckpt_");
  fs::copy(NXD_CKPT_FIXTURES "/v1_zero1_dp2", dir.path, fs::copy_options::recursive);
  const json m = read_metadata(dir.path / "step_3");
  ASSERT_EQ(m["format_version"], 1);
  const ModelConfig c = model_config_from_json(m["model_config"]);
  std::map<std::string, Tensor> file;
  for (auto& [n, t] : io::SafetensorsReader(dir.path / "step_3" / optim_file(0, 0)).read_all())
    file[n] = t;
  auto make = [&](bool zero1) {
    auto model = make_causal_lm(c, 11);
    std::vector<optim::NamedParam> ps;
    for (const auto& [n, t] : model->named_parameters()) ps.push_back({n, t});
    std::unique_ptr<optim::Optimizer> o;
    auto groups = optim::default_param_groups(ps, 1e-2, 0.01);
    if (zero1)
      o = std::make_unique<optim::Zero1AdamW>(groups, optim::Zero1Options{});
    else
      o = std::make_unique<optim::AdamW>(groups);
    return std::pair{model, std::move(o)};
  };
  auto made = make(false);
  std::shared_ptr<CausalLM> m1 = made.first;
  std::unique_ptr<optim::Optimizer> adam = std::move(made.second);
  const json user = load_checkpoint(dir.path, m1.get(), adam.get(), nullptr);
  EXPECT_EQ(user.at("written_by"), "nxd before per-rank ZeRO-1 shards");
  EXPECT_EQ(adam->steps(), 3);
  nxd::testing::expect_same(full_state(*adam), file, "AdamW from format 1");
  for (int n : {2, 3}) {
    run_ranks(n, [&] {
      parallel_state::initialize_model_parallel(1);
      auto [m2, z] = make(true);
      load_checkpoint(dir.path, m2.get(), z.get(), nullptr);
      nxd::testing::expect_same(full_state(*z), file, "ZeRO-1 DP" + std::to_string(n));
      nxd::testing::expect_same(nxd::testing::snapshot(*m2, nullptr),
                                nxd::testing::snapshot(*m1, nullptr), "model");
    });
  }
}

// Damaged ZeRO-1 checkpoints (DP 2) are refused naming the file and tensor, on every rank, and
// the target model and optimizer keep their values.
TEST(Zero1Checkpoint, BadDpShardsAreRefusedAndLeaveTheTargetUntouched) {
  const nxd::testing::ScratchDir root("nxd_z1ckpt_");
  int n = 0;
  auto check = [&](const std::function<void(const fs::path&)>& damage,
                   const std::vector<std::string>& expect, int ffn = 48) {
    const fs::path dir = root.path / ("c" + std::to_string(n++));
    run_ranks(2, [&] {
      parallel_state::initialize_model_parallel(1);
      if (ffn != 48) {  // another model: other sizes
        ModelConfig c = nxd::testing::ckpt_model_config(1);
        c.ffn_hidden_size = ffn;
        auto other = make_causal_lm(c, 3);
        std::vector<optim::NamedParam> ps;
        for (const auto& [nm, t] : other->named_parameters()) ps.push_back({nm, t});
        optim::Zero1AdamW z(optim::default_param_groups(ps, 1e-2, 0.0), {});
        save_checkpoint(dir, "t", other.get(), &z, nullptr);
        return;
      }
      Zero1Trainee a(1, {.zero1 = true});
      a.step(0, shards_of(parallel_state::get_data_parallel_rank(), 2));
      save_checkpoint(dir, "t", a.model.get(), a.opt.get(), nullptr);
    });
    damage(dir / "t");
    run_ranks(2, [&] {
      parallel_state::initialize_model_parallel(1);
      Zero1Trainee b(1, {.zero1 = true, .seed = 5});
      b.step(0, shards_of(parallel_state::get_data_parallel_rank(), 2));
      const auto state = shard_snapshot(*b.opt);
      const auto model = nxd::testing::snapshot(*b.model, nullptr);
      const std::string m =
          error_of([&] { load_checkpoint(dir, b.model.get(), b.opt.get(), nullptr); });
      for (const auto& e : expect)
        EXPECT_NE(m.find(e), std::string::npos) << "'" << e << "' in: " << m;
      nxd::testing::expect_same(shard_snapshot(*b.opt), state, expect.front());
      nxd::testing::expect_same(nxd::testing::snapshot(*b.model, nullptr), model, expect.front());
      EXPECT_EQ(b.opt->steps(), 1);
    });
  };
  const std::string f0 = optim_file(0, 0), f1 = optim_file(1, 0);
  check([&](const fs::path& d) { fs::remove(d / f1); },
        {"missing shard", f1, "tensor '", "are in no DP shard"});
  check([&](const fs::path& d) { fs::resize_file(d / f1, fs::file_size(d / f1) - 40); },
        {"truncated", f1, "tensor '"});
  check(
      [&](const fs::path& d) {
        io::SafetensorsReader r(d / f0);
        const io::TensorInfo& t = r.header().tensors.front();
        std::fstream s(d / f0, std::ios::in | std::ios::out | std::ios::binary);
        s.seekp(r.header().data_start + t.begin);
        s.put('\x7f');
      },
      {"checksum mismatch", f0, "tensor '"});
  check(
      [&](const fs::path& d) {
        json m = json::parse(nxd::testing::slurp(d / "metadata.json"));
        m["format_version"] = kFormatVersion + 1;
        std::ofstream(d / "metadata.json") << m.dump();
      },
      {"format_version " + std::to_string(kFormatVersion + 1), "newer than this nxd"});
  check([](const fs::path&) {}, {"has shape [64,32]", "another model"}, 64);
}

// bf16 parameters with f32 master weights: the masters are saved per DP rank too, round-trip
// bitwise into ZeRO-1 and load into AdamW (with masters) as the gathered state.
TEST(Zero1Checkpoint, MasterWeightsOfBf16Parameters) {
  const nxd::testing::ScratchDir dir("nxd_z1ckpt_");
  std::map<std::string, Tensor> full;
  std::mutex mu;
  run_ranks(2, [&] {
    parallel_state::initialize_model_parallel(1);
    const int d = parallel_state::get_data_parallel_rank();
    Zero1Trainee a(1, {.zero1 = true, .bf16 = true});
    a.step(0, shards_of(d, 2));
    a.step(1, shards_of(d, 2));
    const auto state = shard_snapshot(*a.opt);
    save_checkpoint(dir.path, "t", a.model.get(), a.opt.get(), nullptr);
    auto f = full_state(*a.opt);
    Zero1Trainee b(1, {.zero1 = true, .seed = 4, .bf16 = true});
    load_checkpoint(dir.path, b.model.get(), b.opt.get(), nullptr);
    nxd::testing::expect_same(shard_snapshot(*b.opt), state, "ZeRO-1 bf16");
    std::lock_guard<std::mutex> g(mu);
    if (d == 0) full = std::move(f);
  });
  ASSERT_TRUE(full.count("model.layers.0.mlp.up_proj.weight.master"));
  Zero1Trainee c(1, {.seed = 6, .bf16 = true});
  load_checkpoint(dir.path, c.model.get(), c.opt.get(), nullptr);
  nxd::testing::expect_same(full_state(*c.opt), full, "AdamW bf16 with masters");
}

}  // namespace
}  // namespace nxd::ckpt

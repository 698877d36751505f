// TP2 x DP2 checkpoints on either backend: sim ranks in the normal suite, one process per rank
// under `mpirun -np 4` (label mpi; main is tests/collectives/main.cpp). A plain and an async +
// zstd save resume training with bitwise the same loss, and one rank's damaged shard fails the
// load on every process while no process changes its model. A ZeRO-3 model's per-rank block files
// (each process writes its own) resume with the same loss, bitwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ckpt_util.h"
#include "support/ranks.h"
#include "zero1_util.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using nxd::testing::Trainee;

// One folder for all ranks of a test: processes under mpirun share their parent (the launcher).
// Named after the test too: on sim ranks the parent is ctest, which runs the tests side by side.
fs::path shared_dir() {
  const char* test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  return fs::temp_directory_path() / ("nxd_ckpt_mpi_" + std::to_string(::getppid()) + "_" + test);
}

TEST(CheckpointMpi, Tp2Dp2RoundTripAndFailureOnEveryRank) {
  const fs::path dir = shared_dir();
  const bool ran = nxd::testing::run_ranks(4, [&] {
    parallel_state::initialize_model_parallel(2);
    if (world().rank() == 0) {
      fs::remove_all(dir);
      fs::create_directories(dir);
    }
    world().barrier();
    for (const SaveOptions& so :
         {SaveOptions{}, SaveOptions{.async_save = true, .compress = true}}) {
      const fs::path d = dir / (so.async_save ? "async" : "plain");
      Trainee a(2);
      a.step(0);
      const auto saved = nxd::testing::snapshot(*a.model, a.opt.get());
      save_checkpoint(d, "step_1", a.model.get(), a.opt.get(), a.sched.get(), json{{"k", 1}}, so);
      const double next = a.step(1);
      finalize_checkpoint();
      Trainee b(2, 99);
      EXPECT_EQ(load_checkpoint(d, b.model.get(), b.opt.get(), b.sched.get()).at("k"), 1);
      nxd::testing::expect_same(nxd::testing::snapshot(*b.model, b.opt.get()), saved, d.string());
      EXPECT_EQ(b.step(1), next) << d;
    }
    world().barrier();
    if (world().rank() == 0) {
      std::fstream f(dir / "plain/step_1/model/dp_rank_00_tp_rank_01_pp_rank_00.safetensors",
                     std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-6, std::ios::end);
      f.put('\x33');
    }
    world().barrier();
    Trainee c(2, 5);
    const auto before = nxd::testing::snapshot(*c.model, c.opt.get());
    std::string msg = "no exception";
    try {
      load_checkpoint(dir / "plain", c.model.get(), c.opt.get(), nullptr);
    } catch (const CheckpointError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("checksum mismatch"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tp_rank_01"), std::string::npos) << msg;
    nxd::testing::expect_same(nxd::testing::snapshot(*c.model, c.opt.get()), before, "untouched");
    world().barrier();
    if (world().rank() == 0) fs::remove_all(dir);
  });
  if (!nxd::testing::under_mpi()) {
    EXPECT_TRUE(ran);
  }
}

TEST(CheckpointMpi, Zero3BlocksTp2Dp2RoundTrip) {
  const fs::path dir = shared_dir();
  const bool ran = nxd::testing::run_ranks(4, [&] {
    parallel_state::initialize_model_parallel(2);
    const int d = parallel_state::get_data_parallel_rank();
    if (world().rank() == 0) {
      fs::remove_all(dir);
      fs::create_directories(dir);
    }
    world().barrier();
    const nxd::testing::TraineeOptions o{
        .zero1 = true, .stage = optim::ZeroStage::three, .bucket_bytes = 1 << 12, .root = true};
    nxd::testing::Zero1Trainee a(2, o);
    a.step(0, nxd::testing::shards_of(d, 2));
    save_checkpoint(dir, "step_1", a.model.get(), a.opt.get(), a.sched.get());
    a.step(1, nxd::testing::shards_of(d, 2));
    const double next = a.eval_loss();
    EXPECT_TRUE(read_metadata(dir / "step_1")["parallel"].value("zero3", false));
    auto ob = o;
    ob.seed = 99;
    nxd::testing::Zero1Trainee b(2, ob);
    load_checkpoint(dir, b.model.get(), b.opt.get(), b.sched.get());
    b.step(1, nxd::testing::shards_of(d, 2));
    EXPECT_EQ(b.eval_loss(), next);
    world().barrier();
    if (world().rank() == 0) fs::remove_all(dir);
  });
  if (!nxd::testing::under_mpi()) {
    EXPECT_TRUE(ran);
  }
}

}  // namespace
}  // namespace nxd::ckpt

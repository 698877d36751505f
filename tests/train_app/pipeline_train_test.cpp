// Pipeline parallelism through the trainer and nxd-train's configuration: TP2 x PP2 x DP2 on 8
// sim ranks and PP2 with each schedule (tied embeddings, interleaved virtual stages) give the
// single rank's losses, grad norms and validation losses; activation checkpointing keeps the
// losses bitwise and lowers the activation peak; impossible pipeline settings are config errors
// naming the keys and numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "nxd/pipeline/schedule.h"
#include "nxd/train_app/train.h"
#include "train_util.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
namespace fs = std::filesystem;
using nxd::testing::parallel_run;
using nxd::testing::read_rows;
using nxd::testing::tiny;

namespace {

struct RunOut {
  TrainResult result;
  nxd::testing::Rows rows;
};

// parallel_run with 4 layers and validation every 10 steps over 4 micro batches.
RunOut run(const fs::path& d, const std::string& name, std::vector<std::string> extra) {
  std::vector<std::string> s = {"model.num_layers=4", "trainer.val_check_interval=10",
                                "trainer.limit_val_batches=4"};
  s.insert(s.end(), extra.begin(), extra.end());
  RunOut r;
  r.result = train(tiny(d / name, nxd::testing::tiny_corpus(d), parallel_run(s)), {.quiet = true});
  r.rows = read_rows(d / name / "metrics.csv");
  return r;
}

// Losses within tol per step (relative), the first step's grad norm within 1e-6 and every
// validation loss within tol: the largest differences are printed on failure.
void expect_matches(const RunOut& one, const RunOut& par, double tol, const std::string& what) {
  ASSERT_EQ(par.rows.loss.size(), one.rows.loss.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < one.rows.loss.size(); ++i)
    worst = std::max(worst, std::abs(par.rows.loss[i] - one.rows.loss[i]) / one.rows.loss[i]);
  EXPECT_LE(worst, tol) << what << ": largest relative loss difference " << worst;
  const double g1 = one.rows.grad_norm[0], g2 = par.rows.grad_norm[0];
  EXPECT_LE(std::abs(g2 - g1) / g1, 1e-6) << what << ": step 1 grad norm " << g2 << " vs " << g1;
  ASSERT_TRUE(one.result.final_val_loss && par.result.final_val_loss) << what;
  EXPECT_LE(std::abs(*par.result.final_val_loss - *one.result.final_val_loss), tol * 10) << what;
  EXPECT_LE(std::abs(*par.result.initial_val_loss - *one.result.initial_val_loss), 1e-5) << what;
  EXPECT_EQ(par.result.num_parameters, one.result.num_parameters) << what;
}

}  // namespace

TEST(TrainPipeline, Tp2Pp2Dp2OnEightSimRanksMatchesOneRank) {
  auto d = nxd::testing::test_temp_dir("nxd_pipeline_train_");
  const RunOut one = run(d, "one", {});
  const RunOut par =
      run(d, "tp2pp2dp2",
          {"backend.world_size=8", "distributed_strategy.tensor_model_parallel_size=2",
           "distributed_strategy.pipeline_model_parallel_size=2",
           "distributed_strategy.sequence_parallel=true"});
  expect_matches(one, par, 1e-4, "TP2 x PP2 x DP2");
  EXPECT_GE(par.result.sim_bubble, 0.0);  // modeled on the sim clock
  EXPECT_LT(par.result.sim_bubble, 1.0);
  EXPECT_LT(one.rows.loss.back(), one.rows.loss.front());
}

// Qwen3 (q_norm/k_norm: whole weights on every TP rank whose gradients the pipeline sums over TP,
// head_dim 16 apart from hidden / heads) and Mistral (a sliding window of 8 over sequences of 32)
// from a transformers config.json (model.model_config) at TP2 x PP2 x DP2, with and without SP.
TEST(TrainPipeline, Qwen3AndMistralFromConfigJsonTp2Pp2Dp2MatchOneRank) {
  auto d = nxd::testing::test_temp_dir("nxd_pipeline_families_");
  for (std::string type : {"qwen3", "mistral"}) {
    SCOPED_TRACE(type);
    nlohmann::json j = {{"model_type", type},
                        {"vocab_size", 256},
                        {"hidden_size", 32},
                        {"intermediate_size", 48},
                        {"num_hidden_layers", 4},
                        {"num_attention_heads", 2},
                        {"num_key_value_heads", 2},
                        {"head_dim", 16},
                        {"max_position_embeddings", 64},
                        {"rms_norm_eps", 1e-6},
                        {"sliding_window", type == "mistral" ? nlohmann::json(8) : nullptr}};
    std::ofstream(d / (type + ".json")) << j.dump();
    const std::string mc = "model.model_config=" + (d / (type + ".json")).string();
    const RunOut one = run(d, type + "_one", {mc});
    for (std::string sp : {"false", "true"}) {
      const RunOut par =
          run(d, type + "_tp2pp2dp2_sp" + sp,
              {mc, "backend.world_size=8", "distributed_strategy.tensor_model_parallel_size=2",
               "distributed_strategy.pipeline_model_parallel_size=2",
               "distributed_strategy.sequence_parallel=" + sp});
      expect_matches(one, par, 1e-4, type + " TP2 x PP2 x DP2, sequence_parallel=" + sp);
    }
  }
}

TEST(TrainPipeline, EverySchedulePp2WithTiedEmbeddingsMatchesOneRank) {
  auto d = nxd::testing::test_temp_dir("nxd_pipeline_train_");
  const RunOut one = run(d, "one", {"model.tie_word_embeddings=true"});
  for (std::vector<std::string> s :
       {std::vector<std::string>{"distributed_strategy.pipeline_schedule=gpipe"},
        {"distributed_strategy.pipeline_schedule=1f1b"},
        {"distributed_strategy.pipeline_schedule=interleaved",
         "distributed_strategy.virtual_pipeline_model_parallel_size=2"}}) {
    s.insert(s.end(), {"backend.world_size=2", "distributed_strategy.tensor_model_parallel_size=1",
                       "distributed_strategy.pipeline_model_parallel_size=2",
                       "model.tie_word_embeddings=true"});
    const RunOut par = run(d, "pp2", s);
    expect_matches(one, par, 1e-4, s.front());
  }
}

TEST(TrainPipeline, ActivationCheckpointingIsBitwiseAndLowersThePeak) {
  auto d = nxd::testing::test_temp_dir("nxd_pipeline_train_");
  const std::vector<std::string> pp2 = {"backend.world_size=2",
                                        "distributed_strategy.tensor_model_parallel_size=1",
                                        "distributed_strategy.pipeline_model_parallel_size=2",
                                        "trainer.max_steps=4", "data.seq_length=64"};
  auto with = [&](const std::string& g) {
    auto s = pp2;
    s.push_back("model.activations_checkpoint_granularity=" + g);
    return run(d, "ckpt_" + g, s);
  };
  const RunOut none = with("null"), full = with("full"), selective = with("selective");
  EXPECT_EQ(full.rows.loss, none.rows.loss);
  EXPECT_EQ(selective.rows.loss, none.rows.loss);
  EXPECT_EQ(full.rows.grad_norm, none.rows.grad_norm);
  EXPECT_LT(full.result.activation_peak_bytes, none.result.activation_peak_bytes);
  EXPECT_LT(selective.result.activation_peak_bytes, none.result.activation_peak_bytes);
  std::printf("    activation peak: none %lld, selective %lld, full %lld bytes\n",
              static_cast<long long>(none.result.activation_peak_bytes),
              static_cast<long long>(selective.result.activation_peak_bytes),
              static_cast<long long>(full.result.activation_peak_bytes));
}

TEST(TrainPipeline, ImpossibleSettingsAreConfigErrorsNamingTheNumbers) {
  auto d = nxd::testing::test_temp_dir("nxd_pipeline_train_");
  auto corpus = nxd::testing::tiny_corpus(d);
  auto message = [&](std::vector<std::string> extra) {
    try {
      tiny(d / "x", corpus, extra);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string pp = "distributed_strategy.pipeline_model_parallel_size=";
  EXPECT_NE(message({"backend.world_size=8", pp + "3"}).find("does not divide by 3"),
            std::string::npos);
  EXPECT_NE(message({"backend.world_size=2", pp + "2"}).find("model.num_layers=1 cannot be cut"),
            std::string::npos);
  EXPECT_NE(message({"backend.world_size=2", pp + "2", "model.num_layers=4",
                     "distributed_strategy.virtual_pipeline_model_parallel_size=2"})
                .find("needs distributed_strategy.pipeline_schedule=interleaved"),
            std::string::npos);
  // interleaved: 3 microbatches (global 6 / micro 2) are not a multiple of pp 2
  EXPECT_NE(message({"backend.world_size=2", pp + "2", "model.num_layers=4",
                     "distributed_strategy.virtual_pipeline_model_parallel_size=2",
                     "distributed_strategy.pipeline_schedule=interleaved",
                     "data.global_batch_size=6", "data.micro_batch_size=2"})
                .find("3"),
            std::string::npos);
  EXPECT_NE(message({"backend.world_size=2", pp + "2", "model.num_layers=4",
                     "distributed_strategy.pipeline_partition=cost"})
                .find("pipeline_partition: \"cost\" is not one of parameters, modeled_cost"),
            std::string::npos);
}

// The sim timeline holds every stage's forwards and backwards ("F0", "B0", ...) on a phase lane
// per rank: each rank's order is its 1F1B schedule, and stage 1 starts microbatch 0 only after
// stage 0 finished it (the staircase Perfetto shows).
TEST(TrainPipeline, TimelineShowsEveryStagesScheduleInOrder) {
  auto d = nxd::testing::test_temp_dir("nxd_pipeline_train_");
  const std::string trace = (d / "trace.json").string();
  run(d, "tl",
      {"backend.world_size=2", "distributed_strategy.tensor_model_parallel_size=1",
       "distributed_strategy.pipeline_model_parallel_size=2", "trainer.max_steps=1",
       "model.optim.sched.warmup_steps=0", "trainer.val_check_interval=0",
       "backend.timeline=" + trace});
  std::ifstream in(trace);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::map<int, std::string> order;  // phase lane tid -> "F0 F1 B0 ..."
  std::map<std::pair<int, std::string>, std::pair<double, double>> span;  // (rank, name)
  for (const auto& e : j.at("traceEvents")) {
    if (e.value("cat", "") != "phase") continue;
    const int rank = e.at("tid").get<int>() - 2 * 2;  // phase lanes follow the 2 x 2 others
    const std::string name = e.at("name");
    order[rank] += (order[rank].empty() ? "" : " ") + name;
    const double ts = e.at("ts").get<double>();
    span[{rank, name}] = {ts, ts + e.at("dur").get<double>()};
  }
  pipeline::ScheduleConfig sc;
  sc.pp = 2;
  sc.num_microbatches = 4;  // global 8 / micro 2
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(order[r], pipeline::compute_order(pipeline::build_schedule(sc, r))) << "rank " << r;
  EXPECT_EQ(order[0], "F0 F1 B0 F2 B1 F3 B2 B3");
  const auto at = [&](int r, const char* n) { return span[std::make_pair(r, std::string(n))]; };
  EXPECT_GE(at(1, "F0").first, at(0, "F0").second);
  EXPECT_GE(at(0, "B0").first, at(1, "B0").second);
}

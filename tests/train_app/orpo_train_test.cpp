// ORPO through nxd-train (train_app/orpo_module.h, model_alignment_strategy.orpo.*): one batch's
// loss and gradient through the module against a hand computation in f64; TP 2 + SP and DP 2 +
// ZeRO-1 against one rank; a run that trains and logs its columns; the truncation of long pairs and
// the refusal of a pair with nothing to train; the keys' refusals; NxD Training's DPO spellings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "finetune_util.h"
#include "nxd/autograd/ops.h"
#include "nxd/train_app/alignment_data.h"
#include "nxd/train_app/orpo_module.h"
#include "nxd/train_app/train.h"
#include "support/files.h"
#include "support/tiny_models.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
using namespace nxd::testing::finetune;

namespace {

// Three pairs over vocabulary 64: prompts of 2-4 tokens, responses of 2-6, seq_length 16.
PreferenceDataset pairs_dataset() {
  std::vector<PreferenceExample> ex;
  for (int i = 0; i < 3; ++i) {
    const auto ids = nxd::testing::id_sequence(16, 64, 5, static_cast<uint64_t>(i));
    const size_t p = 2 + i, c = 2 + 2 * i, r = 6 - i;
    ex.push_back({{ids.begin(), ids.begin() + p},
                  {ids.begin() + p, ids.begin() + p + c},
                  {ids.begin() + p + c, ids.begin() + p + c + r},
                  str("pairs.jsonl:", i + 1)});
  }
  return PreferenceDataset(ex, {.seq_length = 16, .max_prompt_length = 8});
}

// The ORPO loss of batch b under lm computed by hand in double from the logits: per row the sum
// s and count t of log softmax(logits)[target] over the targets != -100, a = s / t, log odds
// a - log(1 - e^a), loss = -(sum of chosen s) / (chosen t) - beta mean log sigmoid(h).
double hand_loss(CausalLM& lm, const Batch& b, double beta) {
  NoGradGuard ng;
  const Tensor logits = lm.forward(b.ids);
  const int64_t rows = b.ids.size(0), s = b.ids.size(1), v = logits.size(2);
  const std::vector<double> z = logits.to_vector(), tg = b.targets.to_vector();
  std::vector<double> sum(static_cast<size_t>(rows)), cnt(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < s; ++j) {
      const auto target = static_cast<int64_t>(tg[static_cast<size_t>(r * s + j)]);
      if (target == kIgnoreIndex) continue;
      const double* row = z.data() + (r * s + j) * v;
      const double m = *std::max_element(row, row + v);
      double e = 0;
      for (int64_t k = 0; k < v; ++k) e += std::exp(row[k] - m);
      sum[static_cast<size_t>(r)] += row[target] - m - std::log(e);
      cnt[static_cast<size_t>(r)] += 1;
    }
  auto lo = [](double a) { return a - std::log1p(-std::exp(a)); };
  double nll_sum = 0, nll_tokens = 0, ratio = 0;
  const int64_t n = rows / 2;
  for (int64_t i = 0; i < n; ++i) {
    const size_t c = static_cast<size_t>(2 * i), r = c + 1;
    nll_sum -= sum[c];
    nll_tokens += cnt[c];
    const double h = lo(sum[c] / cnt[c]) - lo(sum[r] / cnt[r]);
    ratio += -std::log1p(std::exp(-h)) / double(n);
  }
  return nll_sum / nll_tokens - beta * ratio;
}

std::vector<double> csv_column(const fs::path& csv, size_t col) {
  std::vector<double> out;
  for (const auto& row : nxd::testing::read_csv(csv).rows) out.push_back(std::stod(row.at(col)));
  return out;
}

}  // namespace

TEST(OrpoModule, BatchLossAndGradientAgainstAHandComputationInF64) {
  // the module's loss of one batch (3 pairs, prompts masked) against hand_loss, and the gradient
  // of a few weights of the embedding, the first layer and the head against central differences
  // of hand_loss (step 1e-5: truncation ~1e-10, rounding ~1e-16 / 1e-5)
  ModelConfig mc = nxd::testing::tiny_model("llama");
  mc.dtype = DType::f64;
  auto lm = make_causal_lm(mc, 3);
  const PreferenceDataset ds = pairs_dataset();
  const Batch b = make_batch(ds, {0, 1, 2});
  const double beta = 0.3;
  EXPECT_EQ(response_token_counts(b.targets), (std::vector<int64_t>{2, 6, 4, 5, 6, 4}));
  const OrpoLoss l = orpo_batch_loss(*lm, b, beta);
  backward(l.loss);
  const double hand = hand_loss(*lm, b, beta);
  std::printf("    ORPO batch loss %.12f, hand %.12f\n", l.loss.item(), hand);
  EXPECT_NEAR(l.loss.item(), hand, 1e-12);
  double worst = 0;
  int checked = 0;
  const auto params = lm->named_parameters();
  for (size_t pi : {size_t{0}, size_t{1}, params.size() - 1}) {
    Tensor w = params[pi].second.detach();
    double* d = w.data<double>();
    const std::vector<double> g = params[pi].second.grad().to_vector();
    for (int64_t k : {int64_t{0}, w.numel() / 3, w.numel() - 1}) {
      const double keep = d[k], eps = 1e-5;
      d[k] = keep + eps;
      const double up = hand_loss(*lm, b, beta);
      d[k] = keep - eps;
      const double down = hand_loss(*lm, b, beta);
      d[k] = keep;
      worst = std::max(worst, std::abs((up - down) / (2 * eps) - g[static_cast<size_t>(k)]));
      ++checked;
    }
  }
  std::printf(
      "    ORPO gradient vs central differences of the hand loss (%d weights): largest "
      "difference %.3g\n",
      checked, worst);
  EXPECT_LT(worst, 1e-8);
}

TEST(OrpoData, LongPairsTruncateThePromptAndEmptyResponsesAreRefusedByRow) {
  // prompt 10 + longer response 6 > seq_length 12: the prompt keeps its first / last 4 tokens
  // (max_prompt_length) and the responses the rest; a pair that fits is not cut
  const std::vector<int64_t> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<PreferenceExample> ex{{prompt, {20, 21, 22, 23, 24, 25}, {30, 31}, "a:1"},
                                          {{1, 2}, {20, 21}, {30}, "a:2"}};
  for (auto mode :
       {PreferenceOptions::Truncation::keep_start, PreferenceOptions::Truncation::keep_end}) {
    PreferenceDataset ds(ex, {.seq_length = 12, .max_prompt_length = 4, .truncation = mode});
    EXPECT_EQ(ds.truncated(), 1);
    std::vector<int64_t> rows(6 * 12);
    ds.get_rows(0, rows.data(), rows.data() + 24, rows.data() + 48);
    const std::vector<int64_t> chosen(rows.begin(), rows.begin() + 10);
    EXPECT_EQ(chosen, (mode == PreferenceOptions::Truncation::keep_start
                           ? std::vector<int64_t>{1, 2, 3, 4, 20, 21, 22, 23, 24, 25}
                           : std::vector<int64_t>{7, 8, 9, 10, 20, 21, 22, 23, 24, 25}));
    ds.get_rows(1, rows.data(), rows.data() + 24, rows.data() + 48);
    EXPECT_EQ(std::vector<int64_t>(rows.begin(), rows.begin() + 4),
              (std::vector<int64_t>{1, 2, 20, 21}));
  }
  const std::string m = message_of([&] {
    (void)PreferenceDataset({{{1, 2}, {3}, {}, "pairs.jsonl:7"}},
                            {.seq_length = 8, .max_prompt_length = 4});
  });
  EXPECT_NE(m.find("pairs.jsonl:7: the rejected response has no token to train"), std::string::npos)
      << m;
}

TEST(OrpoRun, TrainsThroughNxdTrainAndLogsItsColumns) {
  // 24 pairs, 8 steps at lr 1e-2: the loss falls; orpo_metrics.csv has the ORPO columns; with LoRA
  // adapters too
  nxd::testing::ScratchDir d("nxd_orpo_run_");
  const fs::path pairs = dpo_fixture(d);
  for (bool lora : {false, true}) {
    const fs::path out = d.path / (lora ? "lora" : "full");
    std::vector<std::string> o{"data.train_dir=" + pairs.string(),
                               "model_alignment_strategy.orpo.beta=0.1", "trainer.max_steps=8"};
    if (lora) o.push_back("model_alignment_strategy.peft.lora_rank=4");
    const TrainResult r = train(tiny_run(out, o), {.quiet = true});
    EXPECT_EQ(r.steps, 8);
    std::printf("  ORPO%s: loss %.4f -> %.4f over 8 steps\n", lora ? " (LoRA)" : "", r.first_loss,
                r.last_loss);
    EXPECT_LT(r.last_loss, r.first_loss - 0.1);
    const std::string csv = nxd::testing::slurp(out / "orpo_metrics.csv");
    for (const char* k :
         {"orpo_rewards_chosen", "orpo_rewards_rejected", "orpo_rewards_margin",
          "orpo_rewards_accuracy", "orpo_nll_loss", "orpo_log_odds_ratio", "orpo_log_odds_chosen"})
      EXPECT_NE(csv.find(k), std::string::npos) << k;
  }
}

TEST(OrpoRun, TensorAndDataParallelMatchOneRank) {
  // TP 2 with sequence parallelism and DP 2 with ZeRO-1 (sim ranks) against one rank accumulating
  // the same micro batches: 5 steps' losses, the largest difference printed
  nxd::testing::ScratchDir d("nxd_orpo_tp_");
  const fs::path pairs = dpo_fixture(d);
  const std::vector<std::vector<std::string>> layouts{
      {"backend.world_size=1"},
      {"backend.world_size=2", "distributed_strategy.tensor_model_parallel_size=2",
       "distributed_strategy.sequence_parallel=true"},
      {"backend.world_size=2", "distributed_strategy.zero1=true"}};
  std::vector<std::vector<double>> loss;
  for (size_t l = 0; l < layouts.size(); ++l) {
    std::vector<std::string> o{"data.train_dir=" + pairs.string(),
                               "model_alignment_strategy.orpo.beta=0.2",
                               "model_alignment_strategy.orpo.max_prompt_length=8",
                               "trainer.max_steps=5", "data.micro_batch_size=2"};
    o.insert(o.end(), layouts[l].begin(), layouts[l].end());
    const fs::path out = d.path / str("layout", l);
    train(tiny_run(out, o), {.quiet = true});
    loss.push_back(csv_column(out / "metrics.csv", 1));
    ASSERT_EQ(loss.back().size(), 5u);
  }
  std::printf("  ORPO losses on one rank: %.9g ... %.9g\n", loss[0][0], loss[0][4]);
  for (size_t l = 1; l < layouts.size(); ++l) {
    double worst = 0;
    for (size_t i = 0; i < 5; ++i) worst = std::max(worst, std::abs(loss[0][i] - loss[l][i]));
    std::printf("  ORPO %s vs one rank, 5 steps: largest loss difference %.3g\n",
                l == 1 ? "TP 2 + SP" : "DP 2 + ZeRO-1", worst);
    EXPECT_LE(worst, 1e-6);  // 2 f32 ulps of a loss between 4 and 8 (4.8e-7 each)
  }
}

TEST(OrpoConfig, KeysSelectOrpoAndMistakesNameTheKey) {
  nxd::testing::ScratchDir d("nxd_orpo_cfg_");
  const fs::path pairs = dpo_fixture(d);
  const std::string dir = "data.train_dir=" + pairs.string();
  const TrainConfig t =
      tiny_run(d.path / "r", {dir, "model_alignment_strategy.orpo.truncation_mode=keep_end"});
  EXPECT_EQ(t.alignment.kind, AlignmentSection::Kind::orpo);
  EXPECT_EQ(t.alignment.orpo_beta, 0.01);
  EXPECT_EQ(t.alignment.max_prompt_length, 24);  // data.seq_length / 2
  EXPECT_EQ(t.alignment.truncation_mode, "keep_end");
  auto error = [&](std::vector<std::string> o) {
    return message_of([&] { tiny_run(d.path / "r", o); });
  };
  std::string m = error(
      {dir, "model_alignment_strategy.orpo.beta=0.1", "data.alignment_strategy.dpo.kl_beta=0.1"});
  EXPECT_NE(m.find("data.alignment_strategy.dpo.kl_beta (DPO) and "
                   "model_alignment_strategy.orpo.beta (ORPO) are both set"),
            std::string::npos)
      << m;
  m = error({"model_alignment_strategy.orpo.beta=0.1"});
  EXPECT_NE(m.find("model_alignment_strategy.orpo.beta needs data.train_dir"), std::string::npos)
      << m;
  m = error({dir, "model_alignment_strategy.orpo.beta=-1"});
  EXPECT_NE(m.find("model_alignment_strategy.orpo.beta=-1 must be > 0"), std::string::npos) << m;
  m = error({dir, "model_alignment_strategy.orpo.max_prompt_length=48"});
  EXPECT_NE(m.find("model_alignment_strategy.orpo.max_prompt_length=48 must be in [1, "
                   "data.seq_length=48)"),
            std::string::npos)
      << m;
  m = error({dir, "model_alignment_strategy.orpo.truncation_mode=middle"});
  EXPECT_NE(m.find("model_alignment_strategy.orpo.truncation_mode"), std::string::npos) << m;
  m = error({dir, "model_alignment_strategy.orpo.beta=0.1",
             "distributed_strategy.pipeline_model_parallel_size=2", "backend.world_size=2"});
  EXPECT_NE(m.find("model_alignment_strategy.orpo.beta with "
                   "distributed_strategy.pipeline_model_parallel_size=2"),
            std::string::npos)
      << m;
  // NxD Training's model_alignment_strategy.dpo spellings: DPO with their values; both
  // spellings of one setting must agree
  const TrainConfig dpo =
      tiny_run(d.path / "r", {dir, "model_alignment_strategy.dpo.kl_beta=0.2",
                              "model_alignment_strategy.dpo.max_prompt_length=10",
                              "model_alignment_strategy.dpo.truncation_mode=keep_end",
                              "model_alignment_strategy.dpo.loss_type=hinge",
                              "model_alignment_strategy.dpo.precompute_ref_log_probs=false"});
  EXPECT_EQ(dpo.alignment.kind, AlignmentSection::Kind::dpo);
  EXPECT_EQ(dpo.alignment.kl_beta, 0.2);
  EXPECT_EQ(dpo.alignment.max_prompt_length, 10);
  EXPECT_EQ(dpo.alignment.truncation_mode, "keep_end");
  EXPECT_EQ(dpo.alignment.loss_type, "hinge");
  EXPECT_FALSE(dpo.alignment.precompute_ref_log_probs);
  m = error({dir, "model_alignment_strategy.dpo.max_prompt_length=10",
             "data.alignment_strategy.dpo.max_dpo_prompt_length=12"});
  EXPECT_NE(m.find("data.alignment_strategy.dpo.max_dpo_prompt_length=12 disagrees with "
                   "model_alignment_strategy.dpo.max_prompt_length=10"),
            std::string::npos)
      << m;
}

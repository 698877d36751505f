// Fine-tuning (SFT and DPO from jsonl, train_app/alignment_data.h, train_app/dpo_module.h): masked
// positions contribute nothing; packed rows give the padded rows' loss and gradients; the DPO
// loss and its gradient against a hand computation; the reference log-probabilities unchanged by
// training; jsonl and key errors naming the file, line and key; nxd-train runs of SFT (packing
// and padding) and DPO on tiny jsonl fixtures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "finetune_util.h"
#include "nxd/io/chat_template.h"
#include "nxd/io/tokenizer.h"
#include "nxd/layers/packed_documents.h"
#include "nxd/train_app/alignment_data.h"
#include "nxd/train_app/dpo_module.h"
#include "nxd/train_app/train.h"
#include "support/compare.h"
#include "support/files.h"
#include "support/random.h"
#include "support/tiny_models.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
using namespace nxd::testing::finetune;
namespace fs = std::filesystem;

namespace {

// Examples of 3 to 12 tokens (prompts of 1 to 5) over vocabulary 64, from a seed.
std::vector<SftExample> examples(int n, uint64_t seed) {
  std::vector<SftExample> out;
  for (int i = 0; i < n; ++i) {
    const auto len = nxd::testing::id_sequence(2, 1000, seed, 100 + static_cast<uint64_t>(i));
    const int64_t p = 1 + len[0] % 5, c = 2 + len[1] % 8;
    const auto ids = nxd::testing::id_sequence(p + c, 64, seed, static_cast<uint64_t>(i));
    out.push_back({{ids.begin(), ids.begin() + p}, {ids.begin() + p, ids.end()}});
  }
  return out;
}

Batch all_rows(const Dataset& ds) {
  std::vector<int64_t> idx(static_cast<size_t>(ds.size()));
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i);
  return make_batch(ds, idx);
}

ModelConfig model(DType dt, CheckpointGranularity recompute = CheckpointGranularity::none) {
  ModelConfig c = nxd::testing::tiny_model("llama");
  c.dtype = dt;
  c.activations_checkpoint_granularity = recompute;
  return c;
}

struct LossGrads {
  double loss;
  std::vector<std::pair<std::string, Tensor>> grads;
};

LossGrads loss_and_grads(CausalLM& lm, const Batch& b) {
  lm.zero_grad();
  Tensor loss;
  {
    const DocumentScope docs(b.positions);
    loss = lm.loss(b.ids, b.targets);
  }
  backward(loss);
  LossGrads out{loss.item(), {}};
  for (auto& [n, p] : lm.named_parameters()) out.grads.emplace_back(n, p.grad().clone());
  return out;
}

}  // namespace

TEST(SftData, PromptTokensAreMaskedAndCompletionTargetsAreTheNextTokens) {
  const SftExample e{{5, 6, 7}, {8, 9}};
  SftDataset ds({e}, 8, SftLayout::padding);
  const Batch b = all_rows(ds);
  const std::vector<double> ids = b.ids.to_vector(), t = b.targets.to_vector();
  // tokens 5 6 7 8 9, then padding: only the targets 8 and 9 (completion tokens) are trained
  EXPECT_EQ(ids, (std::vector<double>{5, 6, 7, 8, 9, 0, 0, 0}));
  EXPECT_EQ(t, (std::vector<double>{-100, -100, 8, 9, -100, -100, -100, -100}));
  EXPECT_EQ(ds.stats().trained_tokens, 2);
  EXPECT_EQ(ds.stats().masked_tokens, 3);
  // truncated to seq_length, and dropped when the prompt fills it
  SftDataset cut({e, SftExample{{1, 2, 3, 4}, {5}}}, 4, SftLayout::padding);
  EXPECT_EQ(cut.stats().truncated, 2);
  EXPECT_EQ(cut.stats().dropped, 1);
  EXPECT_EQ(cut.size(), 1);
}

TEST(SftData, PackingPlacesWholeExamplesWithRestartingPositions) {
  SftDataset ds({{{1, 2}, {3}}, {{4}, {5, 6}}, {{7, 8, 9}, {10, 11}}}, 8, SftLayout::packing);
  ASSERT_EQ(ds.size(), 2);  // 3 + 3 tokens in row 0, 5 in row 1
  const Batch b = all_rows(ds);
  ASSERT_TRUE(b.positions.defined());
  EXPECT_EQ(b.positions.to_vector(),
            (std::vector<double>{0, 1, 2, 0, 1, 2, 0, 1, 0, 1, 2, 3, 4, 0, 1, 2}));
  EXPECT_EQ(b.targets.to_vector(), (std::vector<double>{-100, 3, -100, 5, 6, -100, -100, -100, -100,
                                                        -100, 10, 11, -100, -100, -100, -100}));
}

TEST(SftLoss, MaskedPositionsContributeNothing) {
  // the loss and every gradient are bitwise the same whatever the targets at masked positions
  // hold (ignored) and whatever tokens stand after a row's last trained target; the loss is the
  // mean of the per-token losses over the trained targets
  auto lm = make_causal_lm(model(DType::f64), 7);
  SftDataset ds(examples(6, 3), 16, SftLayout::padding);
  const Batch b = all_rows(ds);
  const LossGrads ref = loss_and_grads(*lm, b);
  Batch changed{b.ids.clone(), b.targets.clone(), Tensor(), b.sample_ids};
  int64_t* ids = changed.ids.data<int64_t>();
  const int64_t* t = b.targets.data<int64_t>();
  const int64_t S = b.ids.size(1);
  for (int64_t r = 0; r < b.ids.size(0); ++r) {
    int64_t last = -1;
    for (int64_t j = 0; j < S; ++j)
      if (t[r * S + j] != kIgnoreIndex) last = j;
    for (int64_t j = last + 2; j < S; ++j) ids[r * S + j] = (ids[r * S + j] + 17) % 64;
  }
  const LossGrads other = loss_and_grads(*lm, changed);
  EXPECT_EQ(ref.loss, other.loss);
  for (size_t i = 0; i < ref.grads.size(); ++i)
    EXPECT_BITWISE_EQ(ref.grads[i].second, other.grads[i].second) << ref.grads[i].first;
  CrossEntropyOptions none;
  none.reduction = Reduction::none;
  const std::vector<double> per = lm->loss(b.ids, b.targets, none).to_vector();
  double sum = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < b.targets.numel(); ++i) {
    if (t[i] == kIgnoreIndex) {
      EXPECT_EQ(per[static_cast<size_t>(i)], 0.0) << "masked position " << i;
      continue;
    }
    sum += per[static_cast<size_t>(i)];
    ++n;
  }
  EXPECT_EQ(n, ds.stats().trained_tokens);
  EXPECT_NEAR(ref.loss, sum / double(n), 1e-14);
}

TEST(SftLoss, PackedEqualsPaddedLossAndGradients) {
  // the same examples packed 2-4 per row (documents across the rows' middles) and one per padded
  // row: the loss (the mean over the same trained targets) and every gradient within 1e-6, with
  // and without full activation recomputation (whose backward reruns the layers in the scope)
  for (auto rc : {CheckpointGranularity::none, CheckpointGranularity::full}) {
    for (DType dt : {DType::f64, DType::f32}) {
      SCOPED_TRACE(str(dtype_name(dt), rc == CheckpointGranularity::full ? " recompute" : ""));
      auto lm = make_causal_lm(model(dt, rc), 11);
      const auto ex = examples(12, 5);
      SftDataset packed(ex, 32, SftLayout::packing), padded(ex, 32, SftLayout::padding);
      ASSERT_LT(packed.size(), padded.size());
      const LossGrads a = loss_and_grads(*lm, all_rows(packed));
      const LossGrads b = loss_and_grads(*lm, all_rows(padded));
      double worst = 0;
      std::string where;
      for (size_t i = 0; i < a.grads.size(); ++i) {
        const auto x = a.grads[i].second.to_vector(), y = b.grads[i].second.to_vector();
        for (size_t k = 0; k < x.size(); ++k)
          if (std::abs(x[k] - y[k]) > worst)
            worst = std::abs(x[k] - y[k]), where = a.grads[i].first;
      }
      std::printf(
          "  %s%s: %lld packed rows vs %lld padded: loss %.12g vs %.12g (diff %.3g), "
          "largest gradient difference %.3g (%s)\n",
          dtype_name(dt), rc == CheckpointGranularity::full ? " recompute" : "",
          static_cast<long long>(packed.size()), static_cast<long long>(padded.size()), a.loss,
          b.loss, std::abs(a.loss - b.loss), worst, where.c_str());
      EXPECT_NEAR(a.loss, b.loss, 1e-6);
      EXPECT_LE(worst, 1e-6) << where;
    }
  }
}

TEST(Dpo, SigmoidLossAndGradientAgainstAHandComputation) {
  // two pairs: z = beta ((pc - rc) - (pr - rr)); loss = mean(-log sigmoid(z));
  // d loss / d pc = -beta sigmoid(-z) / N, d loss / d pr = +beta sigmoid(-z) / N
  const double beta = 0.1;
  const std::vector<double> p{-3.0, -5.0, -7.5, -2.0}, r{-3.5, -4.0, -6.0, -6.0};
  Tensor pol = from_vector<double>(p, {4});
  pol.set_requires_grad(true);
  const DpoLoss l = dpo_loss(pol, from_vector<double>(r, {4}), {.beta = beta});
  backward(l.loss);
  double loss = 0;
  std::vector<double> grad(4);
  const double rc[2] = {beta * (p[0] - r[0]), beta * (p[2] - r[2])};
  const double rr[2] = {beta * (p[1] - r[1]), beta * (p[3] - r[3])};
  for (int i = 0; i < 2; ++i) {
    const double z = rc[i] - rr[i], sm = 1 / (1 + std::exp(z));  // sigmoid(-z)
    loss += -std::log(1 / (1 + std::exp(-z))) / 2;
    grad[2 * i] = -beta * sm / 2;
    grad[2 * i + 1] = beta * sm / 2;
  }
  EXPECT_NEAR(l.loss.item(), loss, 1e-15);
  const auto g = pol.grad().to_vector();
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(g[i], grad[i], 1e-15) << i;
  EXPECT_NEAR(l.chosen_reward, (rc[0] + rc[1]) / 2, 1e-15);
  EXPECT_NEAR(l.rejected_reward, (rr[0] + rr[1]) / 2, 1e-15);
  EXPECT_NEAR(l.margin, (rc[0] + rc[1] - rr[0] - rr[1]) / 2, 1e-15);
  EXPECT_EQ(l.accuracy, 0.5);  // pair 0: 0.05 - (-0.1) > 0; pair 1: -0.15 - 0.4 < 0
  // finite at any margin, and a gradcheck
  const DpoLoss far = dpo_loss(from_vector<double>({2000, -2000, -2000, 2000}, {4}),
                               from_vector<double>({0, 0, 0, 0}, {4}), {.beta = 1.0});
  EXPECT_NEAR(far.loss.item(), 2000.0, 1e-9);                        // (0 + 4000) / 2
  const Tensor ref6 = from_vector<double>({1, 2, 3, 4, 5, 6}, {6});  // a constant
  nxd::testing::check_grad(
      [&](const auto& in) {
        return std::vector<Tensor>{dpo_loss(in[0], ref6, {.beta = 0.3}).loss};
      },
      {nxd::testing::randn({6}, 3)}, "dpo loss");
}

TEST(Dpo, HingeAndIpoLossesAgainstAHandComputation) {
  // h = (pc - rc) - (pr - rr) per pair: hinge mean(relu(1 - beta h)), ipo mean((h - 1/(2 beta))^2)
  const double beta = 0.5;
  const std::vector<double> p{-3.0, -5.0, -7.5, -2.0, -1.0, -1.5},
      r{-3.5, -4.0, -6.0, -6.0, -2.0, 0.5};  // pair 2: h = 3, hinge inactive
  double h[3];
  for (int i = 0; i < 3; ++i) h[i] = (p[2 * i] - r[2 * i]) - (p[2 * i + 1] - r[2 * i + 1]);
  for (DpoLossType type : {DpoLossType::hinge, DpoLossType::ipo}) {
    Tensor pol = from_vector<double>(p, {6});
    pol.set_requires_grad(true);
    const DpoLoss l = dpo_loss(pol, from_vector<double>(r, {6}), {.beta = beta, .type = type});
    backward(l.loss);
    double loss = 0;
    std::vector<double> grad(6);
    for (int i = 0; i < 3; ++i) {
      double dh = 0;  // d loss_i / d h_i
      if (type == DpoLossType::hinge) {
        loss += std::max(0.0, 1 - beta * h[i]) / 3;
        dh = 1 - beta * h[i] > 0 ? -beta : 0.0;
      } else {
        const double e = h[i] - 1 / (2 * beta);
        loss += e * e / 3;
        dh = 2 * e;
      }
      grad[2 * i] = dh / 3;
      grad[2 * i + 1] = -dh / 3;
    }
    SCOPED_TRACE(type == DpoLossType::hinge ? "hinge" : "ipo");
    EXPECT_NEAR(l.loss.item(), loss, 1e-14);
    const auto g = pol.grad().to_vector();
    for (int i = 0; i < 6; ++i) EXPECT_NEAR(g[i], grad[i], 1e-14) << i;
  }
  EXPECT_THROW(dpo_loss_type("bco_pair"), ConfigError);
}

namespace {

// A DPO module that records the reference and policy log-probabilities of the first training
// pairs when the fit starts and when it ends.
struct Probe {
  std::vector<double> ref_start, ref_end, policy_start, policy_end;
};
class ProbedDpo : public DpoModule {
 public:
  ProbedDpo(const TrainConfig& c, const TrainData& d, Probe* p)
      : DpoModule(c, d.train, d.val), data_(d.train), probe_(p) {}
  void on_fit_start() override {
    DpoModule::on_fit_start();
    record(probe_->ref_start, probe_->policy_start);
  }
  void on_fit_end() override { record(probe_->ref_end, probe_->policy_end); }

 private:
  void record(std::vector<double>& ref, std::vector<double>& pol) {
    const Batch b = make_batch(*data_, {0, 1, 2});
    ref = reference_log_probs(b, /*validation=*/false).to_vector();
    NoGradGuard ng;
    pol = sequence_log_probs(lm(), b.ids, b.targets).to_vector();
  }
  std::shared_ptr<const Dataset> data_;
  Probe* probe_;
};

fs::path sft_fixture(const fs::path& d, int n) {
  std::vector<std::string> rows;
  for (int i = 0; i < n; ++i)
    rows.push_back(str(R"({"prompt": "Q: what is )", i % 7, " plus ", i % 3,
                       R"(?\nA:", "completion": " )", i % 7 + i % 3,
                       std::string(static_cast<size_t>(i % 5), '.'), R"("})"));
  return write_lines(d / "sft.jsonl", rows);
}

}  // namespace

TEST(Dpo, ReferenceLogProbsUnchangedByTraining) {
  // both ways of keeping the reference: a frozen copy scoring every batch, and precomputed
  // log-probabilities; the policy moves, the reference does not, and both references agree
  nxd::testing::ScratchDir d("nxd_dpo_ref_");
  const fs::path data = dpo_fixture(d);
  Probe frozen, pre;
  for (auto [precompute, probe] : {std::pair{false, &frozen}, std::pair{true, &pre}}) {
    const TrainConfig cfg =
        tiny_run(d.path / (precompute ? "pre" : "frozen"),
                 {"data.train_dir=" + data.string(), "data.alignment_strategy.dpo.kl_beta=0.5",
                  str("data.alignment_strategy.dpo.precompute_ref_log_probs=",
                      precompute ? "true" : "false"),
                  "data.alignment_strategy.dpo.max_dpo_prompt_length=16", "trainer.max_steps=3",
                  "model.optim.lr=5e-2"});
    TrainData td = build_data(cfg);
    train(cfg, {.quiet = true},
          [&](const TrainConfig& c) { return std::make_unique<ProbedDpo>(c, td, probe); });
    ASSERT_EQ(probe->ref_start.size(), 6u);
    EXPECT_EQ(probe->ref_start, probe->ref_end) << "the reference moved";
    double moved = 0;
    for (size_t i = 0; i < 6; ++i)
      moved = std::max(moved, std::abs(probe->policy_end[i] - probe->policy_start[i]));
    EXPECT_GT(moved, 1e-3) << "the policy did not train";
    for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(probe->policy_start[i], probe->ref_start[i], 1e-5);
  }
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(frozen.ref_end[i], pre.ref_end[i], 1e-5);
}

TEST(FinetuneErrors, JsonlAndKeyErrorsNameFileLineAndKey) {
  nxd::testing::ScratchDir d("nxd_ft_err_");
  const fs::path bad =
      write_lines(d.path / "bad.jsonl", {R"({"prompt": "a", "completion": "b"})", "", "{not json"});
  std::string m = message_of([&] { read_jsonl(bad.string(), "data.train_dir"); });
  EXPECT_NE(m.find("bad.jsonl:3"), std::string::npos) << m;
  const fs::path missing = write_lines(
      d.path / "missing.jsonl", {R"({"prompt": "a", "completion": "b"})", R"({"prompt": "a"})"});
  m = message_of([&] {
    sft_examples(read_jsonl(missing.string(), "data.train_dir"),
                 [](const std::string&) { return std::vector<int64_t>{1}; });
  });
  EXPECT_NE(m.find("missing.jsonl:2"), std::string::npos) << m;
  EXPECT_NE(m.find("'completion'"), std::string::npos) << m;
  const fs::path typed =
      write_lines(d.path / "typed.jsonl", {R"({"prompt": 3, "completion": "b"})"});
  m = message_of([&] {
    sft_examples(read_jsonl(typed.string(), "data.train_dir"),
                 [](const std::string&) { return std::vector<int64_t>{1}; });
  });
  EXPECT_NE(m.find("typed.jsonl:1: key 'prompt' must be a string"), std::string::npos) << m;
  const fs::path chat =
      write_lines(d.path / "chat.jsonl", {R"({"messages": [{"role": "user", "content": "hi"},)"
                                          R"( {"role": "assistant", "content": "yo"}]})"});
  m = message_of([&] {
    sft_examples(read_jsonl(chat.string(), "data.train_dir"),
                 [](const std::string&) { return std::vector<int64_t>{1}; });
  });
  EXPECT_NE(m.find("chat.jsonl:1: key 'messages'"), std::string::npos) << m;
  EXPECT_NE(m.find("chat template"), std::string::npos) << m;
  // keys: named, with the value
  const fs::path sft = sft_fixture(d, 8);
  m = message_of([&] { tiny_run(d.path / "r", {"data.alignment_strategy.dpo.kl_beta=0.1"}); });
  EXPECT_NE(m.find("data.alignment_strategy.dpo.kl_beta needs data.train_dir"), std::string::npos)
      << m;
  m = message_of([&] {
    tiny_run(d.path / "r",
             {"data.train_dir=" + sft.string(), "data.alignment_strategy.dpo.loss_type=bco_pair"});
  });
  EXPECT_NE(m.find("loss_type=bco_pair is not supported"), std::string::npos) << m;
  m = message_of([&] {
    tiny_run(d.path / "r", {"data.train_dir=" + sft.string(), "data.packing=true",
                            "model_alignment_strategy.sft.packing=false"});
  });
  EXPECT_NE(m.find("disagrees with"), std::string::npos) << m;
  m = message_of([&] {
    tiny_run(d.path / "r",
             {"data.train_dir=" + sft.string(), "data.packing=true",
              "distributed_strategy.context_parallel_size=2", "backend.world_size=2"});
  });
  EXPECT_NE(m.find("context_parallel_size=2"), std::string::npos) << m;
}

TEST(SftData, ChatRowsTrainTheLastAssistantTurn) {
  // a ChatML template: the prompt is the conversation up to the generation prompt, the
  // completion the assistant's answer and its end tag
  const auto chat = io::ChatTemplate::parse(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
      "chatml");
  JsonlRecord r{nlohmann::json::parse(R"({"messages": [{"role": "system", "content": "be brief"},
      {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]})"),
                "t.jsonl:1"};
  std::string prompt, completion;
  int calls = 0;
  sft_examples(
      {r},
      [&](const std::string& s) {
        (calls++ == 0 ? prompt : completion) = s;
        return std::vector<int64_t>(s.size(), 1);
      },
      &chat);
  EXPECT_EQ(prompt,
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(completion, "4<|im_end|>\n");
  JsonlRecord bad{nlohmann::json::parse(R"({"messages": [{"role": "user", "content": "a"},
      {"role": "user", "content": "b"}]})"),
                  "t.jsonl:2"};
  const std::string m = message_of([&] {
    sft_examples(
        {bad}, [](const std::string&) { return std::vector<int64_t>{}; }, &chat);
  });
  EXPECT_NE(m.find("t.jsonl:2: key 'messages' must end with the assistant's turn"),
            std::string::npos)
      << m;
}

TEST(FinetuneRun, SftPackingAndPaddingAndDpoThroughNxdTrain) {
  // nxd-train on a 60-row SFT jsonl, packed and padded (their real tokens/s printed), then DPO:
  // every run finishes with a finite loss and logs its counters
  nxd::testing::ScratchDir d("nxd_ft_run_");
  const fs::path sft = sft_fixture(d, 60);
  for (const char* packing : {"true", "false"}) {
    const fs::path out = d.path / str("sft_", packing);
    const TrainConfig cfg = tiny_run(out, {"data.train_dir=" + sft.string(), "data.seq_length=96",
                                           str("model_alignment_strategy.sft.packing=", packing)});
    char* buf = nullptr;
    size_t len = 0;
    std::FILE* f = open_memstream(&buf, &len);
    const TrainResult r = train(cfg, {.out = f, .tty = false});
    std::fclose(f);
    const std::string text(buf, len);
    std::free(buf);
    EXPECT_EQ(r.steps, 4);
    EXPECT_TRUE(std::isfinite(r.last_loss));
    const size_t at = text.find("sft: ");
    ASSERT_NE(at, std::string::npos) << text;
    std::printf("  packing=%s: %s", packing, text.substr(at, text.find('\n', at) + 1 - at).c_str());
    EXPECT_NE(text.find("data: sft train: 60 examples"), std::string::npos) << text;
    const std::string csv = nxd::testing::slurp(out / "sft_metrics.csv");
    EXPECT_NE(csv.find("sft_trained_tokens"), std::string::npos);
    EXPECT_NE(csv.find("sft_masked_tokens"), std::string::npos);
  }
  const fs::path pairs = dpo_fixture(d);
  const TrainConfig dpo = tiny_run(d.path / "dpo", {"data.train_dir=" + pairs.string(),
                                                    "data.alignment_strategy.dpo.kl_beta=0.1"});
  const TrainResult r = train(dpo, {.quiet = true});
  EXPECT_EQ(r.steps, 4);
  EXPECT_TRUE(std::isfinite(r.last_loss));
  EXPECT_NEAR(r.first_loss, std::log(2.0), 1e-6);  // policy == reference at the first step
  const std::string csv = nxd::testing::slurp(d.path / "dpo" / "dpo_metrics.csv");
  for (const char* k :
       {"dpo_rewards_chosen", "dpo_rewards_rejected", "dpo_rewards_margin", "dpo_rewards_accuracy"})
    EXPECT_NE(csv.find(k), std::string::npos) << k;
}

TEST(FinetuneRun, TensorParallelWithSequenceParallelMatchesOneRank) {
  // packed SFT and DPO at TP 2 with sequence parallelism, and at DP 2 with ZeRO-1 (sim ranks),
  // against one rank accumulating the same micro batches: every step's loss within 1e-5 (the
  // largest difference printed)
  nxd::testing::ScratchDir d("nxd_ft_tp_");
  const fs::path sft = sft_fixture(d, 40), pairs = dpo_fixture(d);
  const std::vector<std::vector<std::string>> cases{
      {"data.train_dir=" + sft.string(), "data.packing=true", "data.seq_length=95"},
      {"data.train_dir=" + pairs.string(), "data.alignment_strategy.dpo.kl_beta=0.3",
       "data.alignment_strategy.dpo.precompute_ref_log_probs=false"}};
  const std::vector<std::vector<std::string>> layouts{
      {"backend.world_size=1"},
      {"backend.world_size=2", "distributed_strategy.tensor_model_parallel_size=2",
       "distributed_strategy.sequence_parallel=true"},
      {"backend.world_size=2", "distributed_strategy.zero1=true"}};
  for (size_t c = 0; c < cases.size(); ++c) {
    std::vector<std::vector<double>> loss(layouts.size());
    for (size_t l = 0; l < layouts.size(); ++l) {
      std::vector<std::string> o = cases[c];
      o.insert(o.end(), layouts[l].begin(), layouts[l].end());
      o.push_back("trainer.max_steps=5");
      o.push_back("data.micro_batch_size=2");
      const fs::path out = d.path / str("case", c, "_layout", l);
      train(tiny_run(out, o), {.quiet = true});
      for (const auto& row : nxd::testing::read_csv(out / "metrics.csv").rows)
        loss[l].push_back(std::stod(row.at(1)));
      ASSERT_EQ(loss[l].size(), 5u);
    }
    std::printf("  %s losses on one rank: %.9g ... %.9g\n", c == 0 ? "SFT" : "DPO", loss[0][0],
                loss[0][4]);
    for (size_t l = 1; l < layouts.size(); ++l) {
      double worst = 0;
      for (size_t i = 0; i < 5; ++i) worst = std::max(worst, std::abs(loss[0][i] - loss[l][i]));
      std::printf("  %s: %s vs one rank, 5 steps: largest loss difference %.3g\n",
                  c == 0 ? "SFT packing (seq 95: SP pads to 96)" : "DPO",
                  l == 1 ? "TP 2 + SP" : "DP 2 + ZeRO-1", worst);
      EXPECT_LE(worst, 1e-5);
    }
  }
}

TEST(FinetuneRun, ChatRowsThroughTheTokenizerFoldersTemplate) {
  // messages rows rendered by tokenizer_config.json's chat_template beside data.tokenizer (the
  // Llama 3 fixture: its added tokens are the template's bos/eos), trained for 3 steps
  nxd::testing::ScratchDir d("nxd_ft_chat_");
  fs::create_directories(d.path / "tok");
  fs::copy_file(fs::path(NXD_TOKENIZER_FIXTURES) / "llama3.tokenizer.json",
                d.path / "tok" / "tokenizer.json");
  const nlohmann::json cfg_json{
      {"bos_token", "<|begin_of_text|>"},
      {"eos_token", "<|end_of_text|>"},
      {"chat_template",
       "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% if m.role == "
       "'assistant' %}{{ eos_token }}{% endif %}{% endfor %}{% if add_generation_prompt "
       "%}assistant: {% endif %}"}};
  std::ofstream(d.path / "tok" / "tokenizer_config.json") << cfg_json.dump();
  std::vector<std::string> rows;
  for (int i = 0; i < 16; ++i)
    rows.push_back(nlohmann::json{{"messages",
                                   {{{"role", "user"}, {"content", str("the cat ", i % 4)}},
                                    {{"role", "assistant"}, {"content", str("sat ", i % 3)}}}}}
                       .dump());
  const fs::path data = write_lines(d.path / "chat.jsonl", rows);
  const TrainConfig cfg = tiny_run(
      d.path / "run", {"data.train_dir=" + data.string(),
                       "data.tokenizer=" + (d.path / "tok" / "tokenizer.json").string(),
                       "model.vocab_size=576", "data.packing=true", "trainer.max_steps=3"});
  const TrainData td = build_data(cfg);
  bool noted = false;
  for (const auto& n : td.notes) noted |= n.find("chat rows rendered by") != std::string::npos;
  EXPECT_TRUE(noted);
  // the first row: bos, the user's turn and the generation prompt masked; the answer and eos
  // trained
  const Batch b = make_batch(*td.train, {0});
  const auto tok = io::Tokenizer::from_file((d.path / "tok" / "tokenizer.json").string());
  const auto prompt = tok.encode("<|begin_of_text|>user: the cat 0\nassistant: ");
  const auto answer = tok.encode("sat 0\n<|end_of_text|>");
  const size_t n = prompt.size() + answer.size();  // the first document of the packed row
  const auto t = b.targets.to_vector();
  int64_t trained = 0;
  for (size_t k = 0; k < n; ++k) trained += t[k] != kIgnoreIndex;
  EXPECT_EQ(trained, static_cast<int64_t>(answer.size()));
  EXPECT_EQ(t[prompt.size() - 2], kIgnoreIndex);  // the prompt's last target is masked
  EXPECT_EQ(t[n - 2], 557.0);                     // the last trained target: eos
  EXPECT_EQ(t[n - 1], kIgnoreIndex);              // the document's end
  const TrainResult r = train(cfg, {.quiet = true});
  EXPECT_EQ(r.steps, 3);
  EXPECT_TRUE(std::isfinite(r.last_loss));
}

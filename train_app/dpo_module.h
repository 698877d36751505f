#pragma once
// DPO (Direct Preference Optimization, NxD Training's data.alignment_strategy.dpo): a policy
// trained on chosen/rejected pairs against a frozen reference, the initial weights.
//
// A batch holds each pair as two rows, chosen then rejected (PreferenceDataset); a row's
// log-probability is the sum of log p(token) over its response tokens (targets != -100). With
// policy log-probabilities pc, pr and the reference's rc, rr:
//   chosen reward  = beta (pc - rc),  rejected reward = beta (pr - rr)
//   h = (pc - rc) - (pr - rr)
//   loss = mean over pairs of  -log sigmoid(beta h)          (sigmoid, DPO)
//                              relu(1 - beta h)              (hinge, SLiC)
//                              (h - 1 / (2 beta))^2          (ipo)
// logged per step as dpo_rewards_chosen, dpo_rewards_rejected, dpo_rewards_margin (their means)
// and dpo_rewards_accuracy (the share of pairs whose chosen reward is larger).
// The reference is a copy of the model after model.init_from (or initialization), built over the
// same TP group and never trained. precompute_ref_log_probs: before the first step it scores every
// training and validation pair once (in order, micro batches of data.micro_batch_size, the same
// on every rank) and is freed; otherwise it scores each batch.
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "nxd/train_app/lm_module.h"

namespace nxd::train_app {

// The DPO loss of the log-probabilities [2N] (pairs as (chosen, rejected) rows) of the policy
// (differentiable) and of the reference (constants), and the figures it logs.
enum class DpoLossType { sigmoid, hinge, ipo };
struct DpoLossOptions {
  double beta = 0.1;
  DpoLossType type = DpoLossType::sigmoid;
};
struct DpoLoss {
  Tensor loss;  // scalar, differentiable in policy
  double chosen_reward = 0, rejected_reward = 0, margin = 0, accuracy = 0;
};
DpoLoss dpo_loss(const Tensor& policy, const Tensor& reference, const DpoLossOptions& o);
// "sigmoid", "hinge", "ipo" (ConfigError naming anything else).
DpoLossType dpo_loss_type(const std::string& name);

// Per row of ids/targets [R, S]: the sum of log p(target) over targets != -100 -> [R]
// (differentiable; vocab-parallel at TP > 1, the same on every rank).
Tensor sequence_log_probs(CausalLM& lm, const Tensor& ids, const Tensor& targets);

class DpoModule : public CausalLMModule {
 public:
  // train_app/val: the datasets whose pairs are precomputed (the ones the data module serves).
  DpoModule(TrainConfig cfg, std::shared_ptr<const trainer::Dataset> train,
            std::shared_ptr<const trainer::Dataset> val);
  std::shared_ptr<Module> build_model() override;  // the policy; the reference beside it
  void on_fit_start() override;                    // precompute_ref_log_probs
  Tensor training_step(const trainer::Batch& batch, int64_t batch_idx) override;
  Tensor validation_step(const trainer::Batch& batch, int64_t batch_idx) override;
  // The reference log-probabilities [2N] of a batch of pairs (precomputed, or the reference
  // model's now).
  Tensor reference_log_probs(const trainer::Batch& batch, bool validation) const;

 private:
  DpoLoss step_loss(const trainer::Batch& batch, bool validation) const;
  Tensor score_reference(const trainer::Batch& batch) const;
  std::shared_ptr<const trainer::Dataset> train_, val_;
  std::shared_ptr<CausalLM> ref_;  // null once precomputed
  std::map<int64_t, std::pair<double, double>> ref_train_,
      ref_val_;  // sample -> (chosen, rejected)
  bool precomputed_ = false;
};

}  // namespace nxd::train_app

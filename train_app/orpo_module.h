#pragma once
// ORPO (odds ratio preference optimization, NxD Training's model_alignment_strategy.orpo): the
// model trained on chosen/rejected pairs without a reference model (train_app/orpo_loss.h).
//
// A batch holds each pair as two rows, chosen then rejected (PreferenceDataset); a row's
// log-probability is the sum of log p(token) over its response tokens (targets != -100, the prompt
// masked) and its token count the number of such targets. Each micro batch's loss is
//   NLL of its chosen responses (per response token) - beta mean log sigmoid(h),
//   h = log odds(mean log p of chosen) - log odds(mean log p of rejected),
// and the step logs, per micro batch (averaged over the step's micro batches like the loss):
// orpo_rewards_chosen, orpo_rewards_rejected (beta times the mean response log-probability),
// orpo_rewards_margin, orpo_rewards_accuracy (the share of pairs whose chosen reward is larger),
// orpo_nll_loss, orpo_log_odds_ratio (mean log sigmoid h) and orpo_log_odds_chosen (mean h).
#include "nxd/train_app/lm_module.h"
#include "nxd/train_app/orpo_loss.h"

namespace nxd::train_app {

// The per-row counts of trained targets (!= -100) of targets [R, S].
std::vector<int64_t> response_token_counts(const Tensor& targets);
// The ORPO loss of a batch of pairs (rows chosen, rejected) under lm: what OrpoModule trains.
OrpoLoss orpo_batch_loss(CausalLM& lm, const trainer::Batch& batch, double beta);

class OrpoModule : public CausalLMModule {
 public:
  using CausalLMModule::CausalLMModule;
  Tensor training_step(const trainer::Batch& batch, int64_t batch_idx) override;
  Tensor validation_step(const trainer::Batch& batch, int64_t batch_idx) override;
};

}  // namespace nxd::train_app

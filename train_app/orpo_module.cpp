#include "nxd/train_app/orpo_module.h"

#include "nxd/train_app/alignment_data.h"
#include "nxd/train_app/dpo_module.h"
#include "nxd/trainer/trainer.h"

namespace nxd::train_app {

std::vector<int64_t> response_token_counts(const Tensor& targets) {
  const int64_t r = targets.size(0), s = targets.size(1);
  const Tensor t = targets.contiguous();
  const int64_t* p = t.data<int64_t>();
  std::vector<int64_t> out(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < s; ++j) out[static_cast<size_t>(i)] += p[i * s + j] != kIgnoreIndex;
  return out;
}

OrpoLoss orpo_batch_loss(CausalLM& lm, const trainer::Batch& batch, double beta) {
  const Tensor lp = sequence_log_probs(lm, batch.ids, batch.targets);
  return orpo_loss(lp, response_token_counts(batch.targets), {.beta = beta});
}

Tensor OrpoModule::training_step(const trainer::Batch& batch, int64_t) {
  const OrpoLoss l = orpo_batch_loss(lm(), batch, config().alignment.orpo_beta);
  trainer().log("orpo_rewards_chosen", l.chosen_reward);
  trainer().log("orpo_rewards_rejected", l.rejected_reward);
  trainer().log("orpo_rewards_margin", l.chosen_reward - l.rejected_reward);
  trainer().log("orpo_rewards_accuracy", l.accuracy);
  trainer().log("orpo_nll_loss", l.nll);
  trainer().log("orpo_log_odds_ratio", l.log_odds_ratio);
  trainer().log("orpo_log_odds_chosen", l.log_odds);
  return l.loss;
}

Tensor OrpoModule::validation_step(const trainer::Batch& batch, int64_t) {
  return orpo_batch_loss(lm(), batch, config().alignment.orpo_beta).loss;
}

}  // namespace nxd::train_app

#pragma once
// ORPO's loss (odds ratio preference optimization, Hong et al. 2024, as TRL's ORPOTrainer computes
// it): supervised fine-tuning on the chosen responses plus an odds-ratio term, no reference model.
// A batch holds each pair as two rows, chosen then rejected (as DPO's, dpo_module.h). With a row's
// mean log-probability a = (sum of log p over its response tokens) / (its response tokens):
//   log odds(a) = a - log(1 - exp(a))
//   h   = log odds(a_chosen) - log odds(a_rejected)                  per pair
//   nll = -(sum over chosen rows of their log-prob sums) / (their response tokens)
//   loss = nll - beta * mean over pairs of log sigmoid(h)
// and the figures TRL logs: the mean of log sigmoid(h) (log_odds_ratio) and of h (log_odds), the
// rewards beta * a of chosen and rejected rows (means) and the share of pairs whose chosen reward
// is larger. nxd-train trains with it when a model_alignment_strategy.orpo key is set
// (orpo_module.h).
#include <cstdint>
#include <vector>

#include "nxd/runtime/tensor.h"

namespace nxd::train_app {

struct OrpoLossOptions {
  double beta = 0.1;  // the odds-ratio term's weight (TRL's beta, the paper's lambda)
};
struct OrpoLoss {
  Tensor loss;  // scalar, differentiable in the log-probabilities
  double nll = 0, log_odds_ratio = 0, log_odds = 0;
  double chosen_reward = 0, rejected_reward = 0, accuracy = 0;
};
// log_probs: [2N] per-row sums of log p over the response tokens (sequence_log_probs), rows
// (chosen, rejected); tokens: each row's response token count. ShapeError for other shapes,
// InvalidArgument naming the row for a count < 1 or a mean log-probability >= 0 (a probability of
// one has infinite odds).
OrpoLoss orpo_loss(const Tensor& log_probs, const std::vector<int64_t>& tokens,
                   const OrpoLossOptions& o = {});

}  // namespace nxd::train_app

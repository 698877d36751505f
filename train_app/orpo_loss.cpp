#include "nxd/train_app/orpo_loss.h"

#include "nxd/autograd/ops.h"
#include "nxd/runtime/error.h"
#include "nxd/train_app/log_sigmoid.h"

namespace nxd::train_app {

OrpoLoss orpo_loss(const Tensor& log_probs, const std::vector<int64_t>& tokens,
                   const OrpoLossOptions& o) {
  NXD_CHECK_SHAPE(log_probs.dim() == 1 && log_probs.size(0) % 2 == 0 &&
                      log_probs.size(0) == static_cast<int64_t>(tokens.size()),
                  "[orpo] log-probabilities must be [2N] (chosen, rejected rows) with one token "
                  "count per row, got ",
                  log_probs.desc(), " and ", tokens.size(), " counts");
  const int64_t n = log_probs.size(0) / 2;
  std::vector<double> inv(tokens.size());
  int64_t chosen_tokens = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    NXD_CHECK(tokens[i] >= 1, "[orpo] row ", i, " has ", tokens[i], " response tokens");
    inv[i] = 1.0 / static_cast<double>(tokens[i]);
    if (i % 2 == 0) chosen_tokens += tokens[i];
  }
  const Tensor mean_lp =
      mul(log_probs, from_vector<double>(inv, {2 * n}).to(log_probs.dtype()));  // a per row
  const std::vector<double> a = mean_lp.detach().to_vector();
  for (size_t i = 0; i < a.size(); ++i)
    NXD_CHECK(a[i] < 0, "[orpo] row ", i, " has mean log-probability ", a[i],
              " (>= 0: a probability of one has infinite odds)");
  // log odds(a) = a - log(1 - exp(a))
  const Tensor odds = sub(mean_lp, log(add(neg(exp(mean_lp)), 1.0)));
  const Tensor pairs = reshape(odds, {n, 2});
  const Tensor h = sub(select(pairs, 1, 0), select(pairs, 1, 1));
  const Tensor log_sig = log_sigmoid(h);
  const Tensor chosen_sum = sum(select(reshape(log_probs, {n, 2}), 1, 0));
  const Tensor nll = mul(chosen_sum, -1.0 / static_cast<double>(chosen_tokens));
  const Tensor ratio = mean(log_sig);
  OrpoLoss out{sub(nll, mul(ratio, o.beta))};
  out.nll = nll.detach().item();
  out.log_odds_ratio = ratio.detach().item();
  out.log_odds = mean(h).detach().item();
  for (int64_t i = 0; i < n; ++i) {
    const double c = o.beta * a[2 * i], r = o.beta * a[2 * i + 1];
    out.chosen_reward += c / double(n);
    out.rejected_reward += r / double(n);
    out.accuracy += (c > r ? 1.0 : 0.0) / double(n);
  }
  return out;
}

}  // namespace nxd::train_app

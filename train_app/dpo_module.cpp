#include "nxd/train_app/dpo_module.h"

#include <numeric>

#include "nxd/runtime/error.h"
#include "nxd/train_app/alignment_data.h"
#include "nxd/train_app/log_sigmoid.h"
#include "nxd/trainer/trainer.h"

namespace nxd::train_app {

DpoLossType dpo_loss_type(const std::string& name) {
  if (name == "sigmoid") return DpoLossType::sigmoid;
  if (name == "hinge") return DpoLossType::hinge;
  if (name == "ipo") return DpoLossType::ipo;
  throw ConfigError(str("[dpo] loss_type=", name, " is not supported (sigmoid, hinge, ipo)"));
}

DpoLoss dpo_loss(const Tensor& policy, const Tensor& reference, const DpoLossOptions& o) {
  const double beta = o.beta;
  NXD_CHECK_SHAPE(
      policy.dim() == 1 && policy.size(0) % 2 == 0 && reference.shape() == policy.shape(),
      "[dpo] log-probabilities must be [2N] (chosen, rejected rows), got policy ", policy.desc(),
      " reference ", reference.desc());
  const int64_t n = policy.size(0) / 2;
  const Tensor ref = reference.detach().to(policy.dtype());
  // rewards beta (log pi - log ref) of the [N, 2] (chosen, rejected) rows
  const Tensor ratios = sub(reshape(policy, {n, 2}), ref.reshape({n, 2}));
  const Tensor rewards = mul(ratios, beta);
  const Tensor h = sub(select(ratios, 1, 0), select(ratios, 1, 1));
  Tensor per_pair;
  if (o.type == DpoLossType::sigmoid) {
    // finite for any x, and with its derivative at x = 0, where a policy equal to its reference
    // starts (log_sigmoid.h)
    per_pair = neg(log_sigmoid(mul(h, beta)));
  } else if (o.type == DpoLossType::hinge) {
    per_pair = relu(add(mul(h, -beta), 1.0));
  } else {
    per_pair = square(add(h, -1.0 / (2.0 * beta)));
  }
  DpoLoss out{mean(per_pair)};
  const std::vector<double> r = rewards.detach().to_vector();
  for (int64_t i = 0; i < n; ++i) {
    out.chosen_reward += r[2 * i] / double(n);
    out.rejected_reward += r[2 * i + 1] / double(n);
    out.accuracy += (r[2 * i] > r[2 * i + 1] ? 1.0 : 0.0) / double(n);
  }
  out.margin = out.chosen_reward - out.rejected_reward;
  return out;
}

Tensor sequence_log_probs(CausalLM& lm, const Tensor& ids, const Tensor& targets) {
  CrossEntropyOptions o;
  o.ignore_index = kIgnoreIndex;
  o.reduction = Reduction::none;
  const Tensor nll = lm.loss(ids, targets, o);  // [R * S], 0 where ignored
  return neg(sum(reshape(nll, {ids.size(0), ids.size(1)}), {1}));
}

DpoModule::DpoModule(TrainConfig cfg, std::shared_ptr<const trainer::Dataset> train,
                     std::shared_ptr<const trainer::Dataset> val)
    : CausalLMModule(std::move(cfg)), train_(std::move(train)), val_(std::move(val)) {}

std::shared_ptr<Module> DpoModule::build_model() {
  std::shared_ptr<Module> policy = CausalLMModule::build_model();
  ref_ = build_causal_lm(model_config(config()), config().seed, ModelPart{});
  const auto src = policy->named_parameters();
  const auto dst = ref_->named_parameters();
  NXD_CHECK(src.size() == dst.size(), "[dpo] the reference has ", dst.size(),
            " parameters, the policy ", src.size());
  NoGradGuard ng;
  for (size_t i = 0; i < src.size(); ++i) {
    NXD_CHECK(src[i].first == dst[i].first, "[dpo] reference parameter ", dst[i].first,
              " where the policy has ", src[i].first);
    dst[i].second.detach().copy_(src[i].second.detach());
    dst[i].second.set_requires_grad(false);
  }
  ref_->eval();
  return policy;
}

Tensor DpoModule::score_reference(const trainer::Batch& batch) const {
  NXD_CHECK(ref_, "[dpo] the reference model was freed after precomputing");
  NoGradGuard ng;
  return sequence_log_probs(*ref_, batch.ids, batch.targets).detach();
}

void DpoModule::on_fit_start() {
  if (!config().alignment.precompute_ref_log_probs || precomputed_) return;
  const int64_t mb = config().data.micro_batch_size;
  auto precompute = [&](const std::shared_ptr<const trainer::Dataset>& ds,
                        std::map<int64_t, std::pair<double, double>>& out) {
    if (!ds) return;
    for (int64_t i0 = 0; i0 < ds->size(); i0 += mb) {
      std::vector<int64_t> idx(static_cast<size_t>(std::min(mb, ds->size() - i0)));
      std::iota(idx.begin(), idx.end(), i0);
      const std::vector<double> lp = score_reference(trainer::make_batch(*ds, idx)).to_vector();
      for (size_t k = 0; k < idx.size(); ++k) out[idx[k]] = {lp[2 * k], lp[2 * k + 1]};
    }
  };
  precompute(train_, ref_train_);
  precompute(val_, ref_val_);
  precomputed_ = true;
  ref_.reset();  // the reference's weights are no longer needed
  trainer().message(str("dpo: reference log-probabilities of ", ref_train_.size(), " train and ",
                        ref_val_.size(),
                        " val pairs precomputed from the initial weights; reference freed"));
}

Tensor DpoModule::reference_log_probs(const trainer::Batch& batch, bool validation) const {
  if (!precomputed_) return score_reference(batch);
  const auto& table = validation ? ref_val_ : ref_train_;
  const std::vector<double> ids = batch.sample_ids.to_vector();
  std::vector<double> out;
  for (double d : ids) {
    const auto it = table.find(static_cast<int64_t>(d));
    NXD_CHECK(it != table.end(), "[dpo] no precomputed reference log-probabilities for ",
              validation ? "val" : "train", " pair ", static_cast<int64_t>(d));
    out.push_back(it->second.first);
    out.push_back(it->second.second);
  }
  return from_vector<double>(out, {static_cast<int64_t>(out.size())});
}

DpoLoss DpoModule::step_loss(const trainer::Batch& batch, bool validation) const {
  const Tensor ref = reference_log_probs(batch, validation);
  const Tensor policy = sequence_log_probs(lm(), batch.ids, batch.targets);
  return dpo_loss(
      policy, ref,
      {.beta = config().alignment.kl_beta, .type = dpo_loss_type(config().alignment.loss_type)});
}

Tensor DpoModule::training_step(const trainer::Batch& batch, int64_t) {
  DpoLoss l = step_loss(batch, /*validation=*/false);
  trainer().log("dpo_rewards_chosen", l.chosen_reward);
  trainer().log("dpo_rewards_rejected", l.rejected_reward);
  trainer().log("dpo_rewards_margin", l.margin);
  trainer().log("dpo_rewards_accuracy", l.accuracy);
  return l.loss;
}

Tensor DpoModule::validation_step(const trainer::Batch& batch, int64_t) {
  return step_loss(batch, /*validation=*/true).loss;
}

}  // namespace nxd::train_app

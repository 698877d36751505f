#include "nxd/pipeline/pipeline_model.h"
#include "nxd/layers/step_hooks.h"
#include "nxd/pipeline/grad_finish.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/runtime/error.h"

namespace nxd::pipeline {

namespace ps = parallel_state;

class PipelineModel::Runner : public StageRunner {
 public:
  Runner(PipelineModel& m, const Tensor& ids, const Tensor& targets, int64_t rows)
      : m_(m), ids_(ids), targets_(targets), rows_(rows) {}
  Tensor forward(int chunk, int mb, const Tensor& input) override {
    CausalLM& lm = *m_.chunks_.at(chunk);
    const ScheduleConfig& s = m_.sched_;
    const int rank = m_.executor_->rank();
    Tensor h = is_first_stage(s, rank, chunk)
                   ? lm.embed(ids_.narrow(0, mb * rows_, rows_).contiguous())
                   : input;
    h = lm.decoder_layers(h);
    // the MoE layers' auxiliary losses of this chunk and microbatch (values: their gradient is
    // injected in the layers' backward), for the reported loss
    if (const Tensor a = lm.moe_aux_loss(); a.defined() && !a.is_meta())
      aux_ += a.item() / s.num_microbatches;
    if (!is_last_stage(s, rank, chunk)) return h;
    Tensor loss =
        lm.head_loss(h, targets_.narrow(0, mb * rows_, rows_).contiguous(), m_.opts_.loss);
    return mul(loss, 1.0 / s.num_microbatches);
  }

  double aux() const { return aux_; }

 private:
  PipelineModel& m_;
  Tensor ids_, targets_;
  int64_t rows_;
  double aux_ = 0;  // this rank's auxiliary losses, each / num_microbatches
};

PipelineModel::PipelineModel(const ModelConfig& cfg, uint64_t seed, PipelineOptions opts)
    : cfg_(cfg), opts_(std::move(opts)) {
  cfg_.validate();
  NXD_CHECK(opts_.loss.reduction == Reduction::mean,
            "[PipelineModel] the per-microbatch loss must be a mean");
  const bool init = ps::model_parallel_is_initialized();
  sched_ =
      ScheduleConfig::checked(init ? ps::get_pipeline_model_parallel_size() : 1,
                              opts_.num_microbatches, opts_.virtual_pipeline_size, opts_.schedule);
  pieces_ = measure_pieces(cfg_, opts_.pieces);
  parts_ = opts_.pipeline_cuts.empty()
               ? auto_partition(pieces_, sched_.num_stages(), opts_.balance)
               : partition_by_cuts(pieces_, opts_.pipeline_cuts, sched_.num_stages());
  pp_group_ = init ? ps::get_pipeline_model_parallel_group_ptr() : make_self_communicator();
  dp_group_ = init ? ps::get_data_parallel_group_ptr() : nullptr;
  const int rank = pp_group_->rank();
  for (int c = 0; c < sched_.vpp; ++c)
    chunks_.push_back(
        build_part(opts_.pieces.build, cfg_, seed, parts_.at(stage_of(sched_, rank, c))));
  if (cfg_.tie_word_embeddings && sched_.pp > 1)
    tied_group_ = pp_group_->split(rank == 0 || rank == sched_.pp - 1 ? 0 : -1, rank);
  executor_ = std::make_unique<Executor>(pp_group_, sched_);
  // gradients are reduced over data x context parallel (the DP group at CP 1); the loss, already
  // the same on every CP rank, is averaged over DP
  if (opts_.dp_grad_sync)
    grad_sync_ = dp_grad_sync_at_step(local_named_parameters(), opts_.dp_bucket_bytes);
}

PipelineModel::~PipelineModel() = default;

void PipelineModel::set_num_microbatches(int m) {
  ScheduleConfig s = sched_;
  s.num_microbatches = m;
  s.validate();
  sched_ = s;
  executor_ = std::make_unique<Executor>(pp_group_, sched_);
}

std::vector<optim::NamedParam> PipelineModel::local_named_parameters() const {
  std::vector<optim::NamedParam> out;
  for (const auto& c : chunks_)
    for (auto& [name, t] : c->named_parameters()) out.push_back({name, t});
  return out;
}

std::vector<optim::NormParam> PipelineModel::norm_params() const {
  std::vector<optim::NormParam> out;
  const bool last_rank = pp_group_->rank() == sched_.pp - 1;
  for (const auto& c : chunks_)
    for (optim::NormParam& p : optim::norm_params(*c)) {
      p.shared = tied_group_ && last_rank &&
                 std::find(pieces_.tied.begin(), pieces_.tied.end(), p.name) != pieces_.tied.end();
      out.push_back(std::move(p));
    }
  return out;
}

optim::NormGroups PipelineModel::norm_groups() const {
  return pipeline_norm_groups();
}

void PipelineModel::zero_grad() {
  for (auto& c : chunks_) c->zero_grad();
}

void PipelineModel::train(bool on) {
  for (auto& c : chunks_) c->train(on);
}

Tensor PipelineModel::run_train(const Tensor& ids, const Tensor& targets) {
  return step(ids, targets, StepKind::train);
}

Tensor PipelineModel::run_eval(const Tensor& ids, const Tensor& targets) {
  return step(ids, targets, StepKind::eval);
}

Tensor PipelineModel::step(const Tensor& ids, const Tensor& targets, StepKind kind) {
  const bool train = kind == StepKind::train;
  NXD_CHECK_SHAPE(ids.dim() == 2 && targets.shape() == ids.shape(),
                  "[PipelineModel] ids and targets must be [B,S] alike: ids=", ids.desc(),
                  " targets=", targets.desc());
  const int64_t M = sched_.num_microbatches;
  NXD_CHECK_SHAPE(ids.size(0) % M == 0, "[PipelineModel] batch of ", ids.size(0),
                  " rows is not divisible into ", M, " microbatches");
  Runner runner(*this, ids, targets, ids.size(0) / M);
  // each microbatch's loss is scaled by 1/M before its backward: so is the MoE layers' injected
  // auxiliary-loss gradient (on every stage, recomputation included)
  TrainingLossScale loss_scale(1.0 / sched_.num_microbatches);
  StepResult res = executor_->run(runner, kind, ids.size(0) / M, ids.size(1));
  if (train) span_seconds_ += res.span_seconds, phase_seconds_ += res.phase_seconds;
  double sum = 0;
  for (const Tensor& l : res.losses)
    if (!l.is_meta()) sum += l.item();  // a meta step (the planner) has no values
  // each returned loss is already divided by M; the stages' MoE auxiliary losses are added to
  // the last stage's (every stage's part is in the sum, as CausalLM::loss adds them)
  double aux = runner.aux();
  if (sched_.pp > 1) pp_group_->all_reduce(&aux, &aux, 1, DType::f64, ReduceOp::sum);
  sum += aux;
  Tensor loss = scalar(sum, DType::f32);
  if (dp_group_ && dp_group_->size() > 1) dp_group_->all_reduce(loss, ReduceOp::avg);
  if (sched_.pp > 1) pp_group_->broadcast(loss, sched_.pp - 1);
  if (train) finish_gradients();
  return loss;
}

void PipelineModel::finish_gradients() {
  if (grad_sync_) grad_sync_->finish();
  for (auto& c : chunks_)
    // SP norms, and Qwen3's q_norm/k_norm under TP: TP-duplicated weights with partial gradients
    if (c->sequence_parallel() || (c->config().qk_norm && c->tensor_parallel_size() > 1))
      allreduce_sequence_parallel_gradients(*c);
  if (tied_group_) {
    const bool first = pp_group_->rank() == 0;
    for (const std::string& name : pieces_.tied) {
      Tensor w = (first ? chunks_.front() : chunks_.back())->get_parameter(name);
      if (!w.requires_grad()) continue;  // frozen (LoRA) on both ends alike
      if (!w.grad().defined()) w.set_grad(zeros_like(w.detach()));
      tied_group_->all_reduce(w.grad(), ReduceOp::sum);
    }
  }
}

int64_t PipelineModel::local_parameter_bytes() const {
  int64_t n = 0;
  for (const auto& p : local_named_parameters()) n += p.param.nbytes();
  return n;
}

std::string PipelineModel::balance_report() const {
  std::ostringstream o;
  if (!opts_.pipeline_cuts.empty()) {
    o << "cut after";
    for (const std::string& c : opts_.pipeline_cuts) o << " " << c;
    o << " (pipeline_cuts)";
  } else {
    o << "balanced by " << partition_balance_name(opts_.balance);
  }
  o << "; modeled cost: " << pieces_.cost_model << "\n";
  double total = 0;
  for (const ModelPart& p : parts_) total += pieces_.part_size(p).seconds;
  for (int s = 0; s < sched_.num_stages(); ++s) {
    const PieceSize n = pieces_.part_size(parts_[s]);
    char cost[96];
    std::snprintf(cost, sizeof cost, "modeled cost %.1f%% (%.3g us at TP 1)",
                  total > 0 ? 100.0 * n.seconds / total : 0.0, n.seconds * 1e6);
    o << "stage " << s << " (pp rank " << s % sched_.pp << "): " << parts_[s].str(cfg_) << ", "
      << n.parameters << " parameters, " << n.bytes << " bytes per rank, " << cost << "\n";
  }
  return o.str();
}

}  // namespace nxd::pipeline

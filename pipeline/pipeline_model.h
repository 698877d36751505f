#pragma once
// PipelineModel: a CausalLM cut into pipeline stages over parallel_state's pipeline group (NxD's
// NxDPPModel). Every rank of the world builds one with the same config and seed; pipeline rank r
// builds its chunks c (stages pp*c + r) only, each a CausalLM part (layers/models/config.h)
// whose parameters have the whole model's names and initial values. The parts are built by
// PipelineOptions::pieces.build: make_causal_lm's families by default, or a user's own CausalLM
// subclass (pieces.h says what its builder must do). Tensor (and sequence) parallelism works
// inside each stage as in the plain model; the data-parallel group averages gradients.
//
// run_train(ids, targets): the batch [B,S] (given on every rank; B divisible by the number of
// microbatches M) is cut into M contiguous row slices; the schedule runs forward and backward;
// the last stage backpropagates loss_mb / M. Then, as NxD's ReduceGradsTask: the DP gradient
// average (GradSync, at_step), the sum of sequence-parallel gradients over TP, and for tied
// embeddings the sum of the embedding's two gradients (first and last stage). The returned loss
// is the mean of the microbatch losses, averaged over DP and broadcast from the last stage, so
// every rank returns the same value. Gradients accumulate into .grad like backward(); zero them
// between steps (zero_grad()).
#include <memory>
#include <string>
#include <vector>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/optim/grad_norm.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/pipeline/executor.h"
#include "nxd/pipeline/partition.h"
#include "nxd/pipeline/schedule.h"

namespace nxd::pipeline {

struct PipelineOptions {
  int num_microbatches = 1;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int virtual_pipeline_size = 1;  // chunks per rank (interleaved)
  // NxD's pipeline_cuts ("model.layers.3": a stage starts after it); empty: auto_partition,
  // balanced by `balance`.
  std::vector<std::string> pipeline_cuts;
  PartitionBalance balance = PartitionBalance::parameters;
  // How the stages (and the measured pieces) are built, and the microbatch the modeled cost
  // prices (pieces.h).
  PieceOptions pieces;
  CrossEntropyOptions loss;  // per microbatch; reduction must be mean
  int64_t dp_bucket_bytes = int64_t{25} << 20;
  // Average the gradients over DP at the end of run_train; off when the optimizer reduces them
  // itself (ZeRO-1 reduce-scatters).
  bool dp_grad_sync = true;
};

class PipelineModel {
 public:
  // Collective over the world (builds groups). ConfigError naming the numbers for an impossible
  // (pp, M, vpp, num_layers, cuts) combination or a part builder that does not build the part
  // it is given.
  PipelineModel(const ModelConfig& cfg, uint64_t seed, PipelineOptions opts = {});
  ~PipelineModel();

  Tensor run_train(const Tensor& ids, const Tensor& targets);
  // The mean microbatch loss without a graph (forward schedule), on every rank.
  Tensor run_eval(const Tensor& ids, const Tensor& targets);

  // This rank's parameters with their whole-model names (chunk order).
  std::vector<optim::NamedParam> local_named_parameters() const;
  // For the gradient norm: the last stage's copy of a tied embedding is `shared` (counted once).
  std::vector<optim::NormParam> norm_params() const;
  // The norm groups: TP and PP of parallel_state.
  optim::NormGroups norm_groups() const;
  void zero_grad();
  void train(bool on = true);
  void eval() { train(false); }

  const std::vector<std::shared_ptr<CausalLM>>& chunks() const { return chunks_; }
  const std::vector<ModelPart>& stages() const { return parts_; }  // every stage's part
  const ModelPieces& pieces() const { return pieces_; }            // the model's measured pieces
  const ScheduleConfig& schedule() const { return sched_; }
  int num_microbatches() const { return sched_.num_microbatches; }
  // Runs the next steps over m microbatches (the planner times a schedule at two counts: the
  // batch given to run_train must then split into m); ConfigError for an m the schedule refuses.
  void set_num_microbatches(int m);
  // How the stages were cut (a first line), then one line per stage: its part, parameter
  // elements and bytes on a rank of that stage, and its share of the modeled cost (forward +
  // backward of one microbatch: ModelPieces::seconds).
  std::string balance_report() const;
  int64_t local_parameter_bytes() const;
  // On the sim clock, summed over run_train calls: the schedules' span on this rank and the time
  // inside its forwards and backwards (1 - phase / span is this rank's bubble).
  double modeled_schedule_seconds() const { return span_seconds_; }
  double modeled_phase_seconds() const { return phase_seconds_; }

 private:
  class Runner;
  Tensor step(const Tensor& ids, const Tensor& targets, StepKind kind);
  void finish_gradients();

  ModelConfig cfg_;
  PipelineOptions opts_;
  ScheduleConfig sched_;
  ModelPieces pieces_;
  std::vector<ModelPart> parts_;
  std::vector<std::shared_ptr<CausalLM>> chunks_;  // chunk c = stage pp*c + rank
  std::shared_ptr<Communicator> pp_group_, dp_group_, tied_group_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<optim::GradSync> grad_sync_;
  double span_seconds_ = 0, phase_seconds_ = 0;
};

}  // namespace nxd::pipeline

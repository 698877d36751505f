#pragma once
// GenericPipelineModel: any model, given as a PipelineSequential (sequential.h), cut into
// pipeline stages over parallel_state's pipeline group, with a loss of the user's (NxD's
// NxDPPModel for an arbitrary module; PipelineModel in pipeline_model.h is the decoder-LM form).
// docs/design/pipeline_any.md.
//
// Every rank builds the whole model alike (on the meta device if it likes: shapes are enough to
// cut it) and hands it over; the pipeline keeps only the pieces of its own stages, so the rest is
// freed once the caller drops the model. The stages are cut
//   - at the pieces whose module type is `transformer_layer_cls` (NxD's transformer_layer_cls): the
//     pieces before the first such layer go with stage 0, the pieces after a layer up to the next
//     one go with that layer, the pieces after the last layer with the last stage, and the layers
//     are split into contiguous runs balanced by parameters (auto_partition);
//   - or after the pieces `pipeline_cuts` names (NxD's pipeline_cuts).
// A parameter held by pieces on different stages (the same tensor registered in both: a tied
// embedding) is tied: each stage holding it keeps a copy, and their gradients are summed after
// the schedule. Tensor parallelism inside the pieces works as in the plain model; the DP group
// averages gradients (GradSync at the step, or the optimizer's).
//
// run_train(batch): every tensor of the batch (given on every rank) is cut along dim 0 into M
// contiguous microbatches; the schedule (GPipe, 1F1B, interleaved) runs forward and backward; the
// last stage backpropagates loss_mb / M, the loss taken from the model's outputs by the LossSpec.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nxd/optim/grad_norm.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/pipeline/executor.h"
#include "nxd/pipeline/schedule.h"
#include "nxd/pipeline/sequential.h"

namespace nxd::pipeline {

// The loss of a microbatch from the model's outputs (the last piece's) and the microbatch.
using LossFn = std::function<Tensor(const std::vector<Tensor>& outputs, const Batch& mb)>;

// NxD's output_loss_value_spec in C++: exactly one of
//   - output_loss_value_spec: outputs[i] is the loss where it is true (exactly one true, one
//     entry per output: the model computes its own loss);
//   - loss_fn: the loss computed from the outputs and the microbatch (the user's loss).
struct LossSpec {
  std::vector<bool> output_loss_value_spec;
  LossFn loss_fn;
};

struct GenericPipelineOptions {
  int num_microbatches = 1;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int virtual_pipeline_size = 1;  // chunks per rank (interleaved)
  // The module type (Module::type_name) of the repeated pieces the stages are cut between.
  std::string transformer_layer_cls;
  // Or: the pieces after which a new stage starts (pp * vpp - 1 of them, in order).
  std::vector<std::string> pipeline_cuts;
  LossSpec loss;
  // Every microbatch's loss in PipelineResult::mb_losses (NxD's return_mb_loss).
  bool return_mb_loss = false;
  // The batch's tensors the pieces see (NxD's input_names); empty: all of them.
  std::vector<std::string> input_names;
  int64_t dp_bucket_bytes = int64_t{25} << 20;
  // Average the gradients over DP at the end of run_train; off when the optimizer reduces them.
  bool dp_grad_sync = true;
};

struct PipelineResult {
  // The mean microbatch loss, averaged over DP: the same on every rank.
  Tensor loss;
  // return_mb_loss: each microbatch's loss (not divided by M), averaged over DP; on every rank.
  std::vector<double> mb_losses;
  // run_eval, on the ranks of the last stage (empty elsewhere): each of the model's outputs over
  // the whole batch, the microbatches' concatenated along dim 0 (a scalar output becomes [M]).
  std::vector<Tensor> outputs;
};

// The pieces [begin, end) of one stage.
struct StagePieces {
  int64_t begin = 0, end = 0;
};

// The stages of `pieces` (ConfigError naming the values: a class that is no piece's, an unknown
// or out-of-order cut, a stage left empty, neither given for more than one stage).
std::vector<StagePieces> partition_pieces(const std::vector<Piece>& pieces, int num_stages,
                                          const std::string& transformer_layer_cls,
                                          const std::vector<std::string>& pipeline_cuts);

class GenericPipelineModel {
 public:
  // Collective over the world (builds groups). ConfigError for an impossible schedule, a bad cut
  // or class (partition_pieces), or a LossSpec that names no loss.
  GenericPipelineModel(std::shared_ptr<PipelineSequential> model, GenericPipelineOptions opts);
  ~GenericPipelineModel();

  PipelineResult run_train(const Batch& batch);
  // The forward schedule without a graph, in eval mode; the outputs on the last stage.
  PipelineResult run_eval(const Batch& batch);

  // This rank's pieces (chunk order), and their parameters with the whole model's names.
  std::vector<const Piece*> local_pieces() const;
  std::vector<optim::NamedParam> local_named_parameters() const;
  // For the gradient norm: a tied copy on a rank after the first holding it is `shared`.
  std::vector<optim::NormParam> norm_params() const;
  optim::NormGroups norm_groups() const;
  // The tied parameters (whole-model names) and the stages holding each.
  const std::vector<std::string>& tied() const { return tied_names_; }
  // Copies every tied parameter from the first stage holding it to the others (after building or
  // materializing the pieces under different names). Collective over the pipeline group.
  void sync_tied_parameters();
  void zero_grad();
  void train(bool on = true);
  void eval() { train(false); }

  const std::vector<StagePieces>& stages() const { return stages_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  const ScheduleConfig& schedule() const { return sched_; }
  int num_microbatches() const { return sched_.num_microbatches; }
  // One line per stage: its pieces and their parameter elements on a rank of that stage.
  std::string partition_report() const;

 private:
  class Runner;
  struct Tied;
  PipelineResult step(const Batch& batch, StepKind kind);
  void finish_gradients();
  Tensor loss_of(const std::vector<Tensor>& outputs, const Batch& mb) const;

  GenericPipelineOptions opts_;
  ScheduleConfig sched_;
  std::vector<Piece> pieces_;  // every piece; module null where another stage holds it
  std::vector<StagePieces> stages_;
  std::vector<int64_t> piece_params_;  // parameter elements of each piece
  std::vector<std::string> tied_names_;
  std::vector<Tied> tied_;
  std::map<const TensorImpl*, std::string> names_;  // local tensors' whole-model names
  std::shared_ptr<Communicator> pp_group_, dp_group_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<optim::GradSync> grad_sync_;
};

}  // namespace nxd::pipeline

#include "nxd/pipeline/generic_pipeline.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "nxd/autograd/graph.h"
#include "nxd/autograd/ops.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/pipeline/grad_finish.h"
#include "nxd/runtime/error.h"

namespace nxd::pipeline {

namespace ps = parallel_state;

// A parameter held by pieces on more than one pipeline rank.
struct GenericPipelineModel::Tied {
  std::string name;
  Tensor tensor;                        // this rank's copy (undefined if it holds none)
  std::shared_ptr<Communicator> group;  // the ranks holding it (null on the others)
  int root = 0;                         // the group rank of the first stage holding it
  bool shared = false;                  // counted by another rank's gradient norm
};

class GenericPipelineModel::Runner : public StageRunner {
 public:
  Runner(GenericPipelineModel& m, std::vector<Batch> mbs, StepKind kind)
      : m_(m),
        mbs_(std::move(mbs)),
        kind_(kind),
        mb_losses(mbs_.size(), 0.0),
        outputs(mbs_.size()) {}

  Tensor forward(int chunk, int mb, const Tensor& input) override {
    const ScheduleConfig& s = m_.sched_;
    const int stage = stage_of(s, m_.executor_->rank(), chunk);
    const StagePieces& sp = m_.stages_.at(stage);
    const Batch& b = mbs_.at(mb);
    const int64_t n = static_cast<int64_t>(m_.pieces_.size());
    Tensor x = input;
    std::vector<Tensor> outs;
    for (int64_t i = sp.begin; i < sp.end; ++i) {
      outs = run_piece(m_.pieces_[i], i, n, x, b);
      if (i + 1 < n) x = outs.front();
    }
    if (stage != s.num_stages() - 1) return x;
    Tensor loss = m_.loss_of(outs, b);
    if (!loss.is_meta()) mb_losses[mb] = loss.item();
    if (kind_ == StepKind::eval)
      for (const Tensor& o : outs) outputs[mb].push_back(o.detach());
    return mul(loss, 1.0 / s.num_microbatches);
  }

 private:
  GenericPipelineModel& m_;
  std::vector<Batch> mbs_;
  StepKind kind_;

 public:
  std::vector<double> mb_losses;             // the last stage's, per microbatch
  std::vector<std::vector<Tensor>> outputs;  // eval, the last stage: per microbatch
};

namespace {

void check_loss_spec(const LossSpec& l) {
  const auto& spec = l.output_loss_value_spec;
  const bool by_spec = !spec.empty();
  if (by_spec == static_cast<bool>(l.loss_fn))
    throw ConfigError(by_spec ? "[pipeline] the LossSpec gives both output_loss_value_spec and "
                                "loss_fn: give one"
                              : "[pipeline] the LossSpec gives neither output_loss_value_spec "
                                "nor loss_fn: the pipeline needs to know the loss");
  if (!by_spec) return;
  const auto losses = std::count(spec.begin(), spec.end(), true);
  if (losses != 1) {
    std::string s;
    for (bool b : spec) s += (s.empty() ? "" : ", ") + std::string(b ? "true" : "false");
    throw ConfigError(str("[pipeline] output_loss_value_spec {", s, "} names ", losses,
                          " outputs as the loss: mark exactly one"));
  }
}

// The batch's tensors the pieces see, each with the same number of rows.
Batch select_inputs(const Batch& batch, const std::vector<std::string>& names) {
  auto keys = [&] {
    std::string s;
    for (const auto& [k, t] : batch) s += (s.empty() ? "" : ", ") + k;
    return s;
  };
  Batch in;
  if (names.empty()) in = batch;
  for (const std::string& n : names) {
    auto it = batch.find(n);
    if (it == batch.end())
      throw ConfigError(
          str("[pipeline] input_names names '", n, "', which the batch lacks; it has: ", keys()));
    in[n] = it->second;
  }
  if (in.empty()) throw ConfigError("[pipeline] the batch has no tensors");
  const auto& [first, t0] = *in.begin();
  for (const auto& [k, t] : in)
    NXD_CHECK_SHAPE(t.defined() && t.dim() >= 1 && t.size(0) == t0.size(0), "[pipeline] batch '", k,
                    "' is ", t.defined() ? t.desc() : std::string("undefined"), ", batch '", first,
                    "' ", t0.desc(), ": every tensor needs the same rows (dim 0)");
  return in;
}

// A key for the executor's activation-shape cache: every input's name and shape.
int64_t shapes_key(const Batch& b) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (const auto& [k, t] : b) {
    for (char c : k) mix(static_cast<unsigned char>(c));
    for (int64_t d = 0; d < t.dim(); ++d) mix(static_cast<uint64_t>(t.size(d)));
  }
  return static_cast<int64_t>(h >> 1);
}

}  // namespace

GenericPipelineModel::GenericPipelineModel(std::shared_ptr<PipelineSequential> model,
                                           GenericPipelineOptions opts)
    : opts_(std::move(opts)) {
  NXD_CHECK_T(ConfigError, model != nullptr, "[pipeline] no model");
  check_loss_spec(opts_.loss);
  const bool init = ps::model_parallel_is_initialized();
  sched_ =
      ScheduleConfig::checked(init ? ps::get_pipeline_model_parallel_size() : 1,
                              opts_.num_microbatches, opts_.virtual_pipeline_size, opts_.schedule);
  pieces_ = model->pieces();
  stages_ = partition_pieces(pieces_, sched_.num_stages(), opts_.transformer_layer_cls,
                             opts_.pipeline_cuts);
  pp_group_ = init ? ps::get_pipeline_model_parallel_group_ptr() : make_self_communicator();
  dp_group_ = init ? ps::get_data_parallel_group_ptr() : nullptr;
  const int rank = pp_group_->rank();
  std::map<const TensorImpl*, std::string> whole;  // every parameter's whole-model name
  for (const auto& [n, t] : model->named_parameters()) whole[t.impl()] = n;
  std::map<const TensorImpl*, std::vector<int>> holders;  // the stages holding each parameter
  for (int s = 0; s < sched_.num_stages(); ++s)
    for (int64_t i = stages_[s].begin; i < stages_[s].end; ++i) {
      int64_t count = 0;
      for (const auto& [n, t] : pieces_[i].module->named_parameters()) {
        std::vector<int>& h = holders[t.impl()];
        if (h.empty() || h.back() != s) h.push_back(s);
        count += t.numel();
      }
      piece_params_.push_back(count);
    }
  for (const auto& [n, t] : model->named_parameters())
    NXD_CHECK_T(ConfigError, holders.count(t.impl()), "[pipeline] parameter '", n,
                "' belongs to no piece (it is registered on ", model->type_name(),
                " itself): a pipeline runs the pieces only");
  std::set<int> mine;  // this rank's stages
  for (int c = 0; c < sched_.vpp; ++c) mine.insert(stage_of(sched_, rank, c));
  for (int s = 0; s < sched_.num_stages(); ++s)
    for (int64_t i = stages_[s].begin; i < stages_[s].end; ++i) {
      if (!mine.count(s)) {
        pieces_[i].module.reset();  // another stage's: freed with the model
        continue;
      }
      for (const auto& [n, t] : pieces_[i].module->named_parameters())
        names_[t.impl()] = whole.at(t.impl());
    }
  for (const auto& [n, t] : model->named_parameters()) {
    std::set<int> ranks;
    for (int s : holders.at(t.impl())) ranks.insert(s % sched_.pp);
    if (holders.at(t.impl()).size() < 2) continue;
    tied_names_.push_back(n);
    if (ranks.size() < 2) continue;  // every holder on this rank: one tensor
    Tied tie;
    tie.name = n;
    const int first = holders.at(t.impl()).front() % sched_.pp;
    const bool member = ranks.count(rank) > 0;
    tie.group = pp_group_->split(member ? 0 : -1, rank);
    if (!member) continue;
    tie.tensor = t;
    tie.root = static_cast<int>(std::distance(ranks.begin(), ranks.find(first)));
    tie.shared = rank != first;
    tied_.push_back(std::move(tie));
  }
  executor_ = std::make_unique<Executor>(pp_group_, sched_);
}

GenericPipelineModel::~GenericPipelineModel() = default;

std::vector<const Piece*> GenericPipelineModel::local_pieces() const {
  std::vector<const Piece*> out;
  for (int c = 0; c < sched_.vpp; ++c) {
    const StagePieces& sp = stages_.at(stage_of(sched_, pp_group_->rank(), c));
    for (int64_t i = sp.begin; i < sp.end; ++i) out.push_back(&pieces_[i]);
  }
  return out;
}

std::vector<optim::NamedParam> GenericPipelineModel::local_named_parameters() const {
  std::vector<optim::NamedParam> out;
  std::set<const TensorImpl*> seen;
  for (const Piece* p : local_pieces())
    for (const auto& [n, t] : p->module->named_parameters())
      if (seen.insert(t.impl()).second) out.push_back({names_.at(t.impl()), t});
  return out;
}

std::vector<optim::NormParam> GenericPipelineModel::norm_params() const {
  std::vector<optim::NormParam> out;
  std::set<const TensorImpl*> seen;
  for (const Piece* p : local_pieces())
    for (optim::NormParam& np : optim::norm_params(*p->module)) {
      if (!seen.insert(np.param.impl()).second) continue;
      np.name = names_.at(np.param.impl());
      for (const Tied& t : tied_)
        if (t.name == np.name) np.shared = t.shared;
      out.push_back(std::move(np));
    }
  return out;
}

optim::NormGroups GenericPipelineModel::norm_groups() const {
  return pipeline_norm_groups();
}

void GenericPipelineModel::sync_tied_parameters() {
  for (Tied& t : tied_) {
    Tensor d = t.tensor.detach();
    t.group->broadcast(d, t.root);
  }
}

void GenericPipelineModel::zero_grad() {
  for (const Piece* p : local_pieces()) p->module->zero_grad();
}

void GenericPipelineModel::train(bool on) {
  for (const Piece* p : local_pieces()) p->module->train(on);
}

Tensor GenericPipelineModel::loss_of(const std::vector<Tensor>& outputs, const Batch& mb) const {
  Tensor l;
  if (opts_.loss.loss_fn) {
    l = opts_.loss.loss_fn(outputs, mb);
  } else {
    const std::vector<bool>& spec = opts_.loss.output_loss_value_spec;
    NXD_CHECK_T(ConfigError, spec.size() == outputs.size(),
                "[pipeline] output_loss_value_spec has ", spec.size(),
                " entries, the model returns ", outputs.size(), " output(s)");
    l = outputs.at(std::find(spec.begin(), spec.end(), true) - spec.begin());
  }
  NXD_CHECK_T(ConfigError, l.defined() && l.numel() == 1,
              "[pipeline] the loss must be a scalar, got ",
              l.defined() ? l.desc() : std::string("no tensor"));
  return l;
}

PipelineResult GenericPipelineModel::run_train(const Batch& batch) {
  return step(batch, StepKind::train);
}

PipelineResult GenericPipelineModel::run_eval(const Batch& batch) {
  NoGradGuard ng;
  train(false);
  PipelineResult r = step(batch, StepKind::eval);
  train(true);
  return r;
}

PipelineResult GenericPipelineModel::step(const Batch& batch, StepKind kind) {
  const bool train = kind == StepKind::train;
  const Batch in = select_inputs(batch, opts_.input_names);
  const int M = sched_.num_microbatches;
  const int64_t B = in.begin()->second.size(0);
  NXD_CHECK_SHAPE(B % M == 0, "[pipeline] batch of ", B, " rows is not divisible into ", M,
                  " microbatches");
  const int64_t rows = B / M;
  std::vector<Batch> mbs(M);
  for (int i = 0; i < M; ++i)
    for (const auto& [k, t] : in) mbs[i][k] = t.narrow(0, i * rows, rows).contiguous();
  // built at the first step: the parameters are materialized by then
  if (train && !grad_sync_ && opts_.dp_grad_sync)
    grad_sync_ = dp_grad_sync_at_step(local_named_parameters(), opts_.dp_bucket_bytes);
  Runner runner(*this, std::move(mbs), kind);
  StepResult res = executor_->run(runner, kind, rows, shapes_key(in));
  const bool last = pp_group_->rank() == sched_.pp - 1;
  PipelineResult out;
  double sum = 0;
  for (const Tensor& l : res.losses)
    if (!l.is_meta()) sum += l.item();
  out.loss = scalar(sum, DType::f32);
  const bool dp = dp_group_ && dp_group_->size() > 1;
  if (dp) dp_group_->all_reduce(out.loss, ReduceOp::avg);
  if (sched_.pp > 1) pp_group_->broadcast(out.loss, sched_.pp - 1);
  if (opts_.return_mb_loss) {
    Tensor v = from_vector<double>(runner.mb_losses, {M});
    if (dp) dp_group_->all_reduce(v, ReduceOp::avg);
    if (sched_.pp > 1) pp_group_->broadcast(v, sched_.pp - 1);
    out.mb_losses = v.to_vector();
  }
  if (!train && last)
    for (size_t o = 0; o < runner.outputs.front().size(); ++o) {
      std::vector<Tensor> parts;
      for (const auto& mb : runner.outputs) {
        const Tensor& t = mb.at(o);
        parts.push_back(t.dim() == 0 ? t.reshape({1}) : t);
      }
      out.outputs.push_back(cat(parts, 0));
    }
  if (train) finish_gradients();
  return out;
}

void GenericPipelineModel::finish_gradients() {
  if (grad_sync_) grad_sync_->finish();
  for (const Piece* p : local_pieces()) {
    bool sp = false;
    for (const ParallelParameter& pp : parallel_parameters(*p->module))
      sp = sp || pp.attrs.sequence_parallel_enabled;
    if (sp) allreduce_sequence_parallel_gradients(*p->module);
  }
  for (Tied& t : tied_) {
    if (!t.tensor.requires_grad()) continue;
    if (!t.tensor.grad().defined()) t.tensor.set_grad(zeros_like(t.tensor.detach()));
    t.group->all_reduce(t.tensor.grad(), ReduceOp::sum);
  }
}

std::string GenericPipelineModel::partition_report() const {
  std::ostringstream o;
  for (int s = 0; s < sched_.num_stages(); ++s) {
    const StagePieces& sp = stages_[s];
    int64_t n = 0;
    o << "stage " << s << " (pp rank " << s % sched_.pp << "):";
    for (int64_t i = sp.begin; i < sp.end; ++i) {
      o << " " << pieces_[i].name;
      n += piece_params_[i];
    }
    o << ", " << n << " parameter elements per rank\n";
  }
  return o.str();
}

}  // namespace nxd::pipeline

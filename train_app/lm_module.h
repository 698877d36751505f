#pragma once
// nxd-train's built-in module and data: a decoder language model (model.arch: Llama or GPT-NeoX)
// trained with the optimizer and schedule of model.optim.*, on the data of data.*. To train
// another architecture with nxd-train's configuration (pipeline parallelism included), derive from
// CausalLMModule and override build_causal_lm() (examples/new_model/ does).
#include <memory>
#include <string>
#include <vector>

#include "nxd/io/tokenizer.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/train_app/config.h"
#include "nxd/train_app/corpus.h"
#include "nxd/trainer/module.h"

namespace nxd::train_app {

class CausalLMModule : public trainer::TrainingModule {
 public:
  explicit CausalLMModule(TrainConfig cfg) : cfg_(std::move(cfg)) {}
  std::shared_ptr<Module> build_model() override;
  // Pipeline parallelism: a PipelineModel of model_config(config()) whose stages are parts built by
  // build_causal_lm, cut by distributed_strategy.pipeline_partition (the modeled cost prices a
  // microbatch of data.micro_batch_size x data.seq_length).
  std::shared_ptr<pipeline::PipelineModel> build_pipeline_model(
      const pipeline::PipelineOptions& opts) override;
  // lm().loss(ids, targets): the mean token cross entropy over the targets that are not -100
  // (vocab-parallel at TP > 1); a packed batch (batch.positions) runs inside a DocumentScope. With
  // SFT data it logs the running totals sft_trained_tokens and sft_masked_tokens (targets -100:
  // prompt tokens, document ends, padding) while training.
  Tensor training_step(const trainer::Batch& batch, int64_t batch_idx) override;
  // AdamW or SGD over param_groups_by_weight_decay, with the warmup + decay schedule.
  trainer::OptimizerSetup configure_optimizers() override;
  std::string transformer_layer_type() const override;

  CausalLM& lm() const;  // the built model (the whole model: not under pipeline parallelism)
  const TrainConfig& config() const { return cfg_; }
  // model.init_from: what loading the weights noted (buffers ignored, shards read).
  const std::vector<std::string>& init_notes() const { return init_notes_; }

 protected:
  // `part` of the model cfg describes, over the current TP group: make_causal_lm(cfg, seed, part).
  // cfg is model_config(config()) and seed config().seed, except that the pipeline also builds
  // single pieces on the meta device to measure them; the whole model is the default part. An
  // override builds its own CausalLM subclass of that part (pipeline/pieces.h, PartBuilder).
  virtual std::shared_ptr<CausalLM> build_causal_lm(const ModelConfig& cfg, uint64_t seed,
                                                    const ModelPart& part);

 private:
  TrainConfig cfg_;
  std::shared_ptr<CausalLM> lm_;
  std::vector<std::string> init_notes_;
  int64_t trained_tokens_ = 0, masked_tokens_ = 0;
};

// The optimizer and schedule of model.optim.* over `params` (CausalLMModule::configure_optimizers;
// nxd-plan's meta step builds the same over its meta model).
trainer::OptimizerSetup optimizer_for(const TrainConfig& cfg,
                                      const std::vector<optim::NamedParam>& params);

struct TrainData {
  std::shared_ptr<const trainer::Dataset> train, val;
  std::shared_ptr<const io::Tokenizer> tokenizer;  // data.tokenizer (null: byte level)
  std::string description;                         // one line: source, tokens, files, samples
  std::vector<SkippedFile> skipped;                // files of a text folder that were not read
  std::vector<std::string> notes;  // more lines the run prints under "data:" (SFT, DPO)
  // SFT: the share of the training rows' token slots that hold example tokens, and the share
  // one example per padded row would give (the run prints its real tokens/s with both)
  double real_token_fraction = 1, padding_real_token_fraction = 1;
};
// The jsonl data of data.train_dir / data.val_dir (train_app/alignment_data.h): SFT examples,
// padded or packed, or DPO pairs.
TrainData build_alignment_data(const TrainConfig& cfg);
// Loads the data of cfg.data (throws IoError / ConfigError naming the path and keys).
TrainData build_data(const TrainConfig& cfg);
// The data module of cfg.data: micro batches of data.micro_batch_size, shuffled from the seed.
std::unique_ptr<trainer::DatasetDataModule> make_data_module(const TrainData& data,
                                                             const TrainConfig& cfg);

// Summarizes skipped files, grouped by reason: "skipped 62 files: 31 binary (art.dat, ...), ..."
std::string summarize_skipped(const std::vector<SkippedFile>& skipped);

}  // namespace nxd::train_app

#include "nxd/train_app/lm_module.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "nxd/layers/moe/moe.h"
#include "nxd/layers/packed_documents.h"
#include "nxd/layers/step_hooks.h"
#include "nxd/optim/elementwise_optimizer.h"
#include "nxd/optim/lr_schedule.h"
#include "nxd/runtime/error.h"
#include "nxd/train_app/alignment_data.h"
#include "nxd/train_app/corpus.h"
#include "nxd/train_app/init_from.h"
#include "nxd/trainer/trainer.h"

namespace fs = std::filesystem;

namespace nxd::train_app {

namespace {

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > (v < 0 ? 1 : 0); i -= 3) {
    s.insert(static_cast<size_t>(i), 1, ',');
  }
  return s;
}

}  // namespace

std::shared_ptr<Module> CausalLMModule::build_model() {
  lm_ = build_causal_lm(model_config(cfg_), cfg_.seed, ModelPart{});
  init_notes_ = load_init_weights(cfg_, {lm_.get()}, /*whole=*/true);
  return lm_;
}

std::shared_ptr<CausalLM> CausalLMModule::build_causal_lm(const ModelConfig& cfg, uint64_t seed,
                                                          const ModelPart& part) {
  return make_causal_lm(cfg, seed, part);
}

std::shared_ptr<pipeline::PipelineModel> CausalLMModule::build_pipeline_model(
    const pipeline::PipelineOptions& opts) {
  pipeline::PipelineOptions o = opts;
  o.balance = cfg_.dist.pipeline_partition;
  o.pieces.build = [this](const ModelConfig& c, uint64_t seed, const ModelPart& part) {
    return build_causal_lm(c, seed, part);
  };
  o.pieces.micro_batch_size = cfg_.data.micro_batch_size;
  o.pieces.seq_length = cfg_.data.seq_length;
  o.pieces.layer_type = transformer_layer_type();  // how the pipeline knows a decoder layer
  auto p = std::make_shared<pipeline::PipelineModel>(model_config(cfg_), cfg_.seed, o);
  std::vector<Module*> chunks;
  for (const auto& c : p->chunks()) chunks.push_back(c.get());
  init_notes_ = load_init_weights(cfg_, chunks, /*whole=*/false);
  return p;
}

CausalLM& CausalLMModule::lm() const {
  if (pipeline())
    throw InvalidArgument(
        "[trainer] CausalLMModule::lm(): under pipeline parallelism the model "
        "is split into stages (pipeline())");
  if (!lm_) throw InternalError("[trainer] CausalLMModule::lm() before build_model()");
  return *lm_;
}

Tensor CausalLMModule::training_step(const trainer::Batch& batch, int64_t) {
  Tensor loss;
  {
    const DocumentScope docs(batch.positions);  // packed SFT rows; nothing otherwise
    loss = lm().loss(batch.ids, batch.targets);
  }
  // the model's figures of this micro batch on this rank (the trainer logs the logging rank's
  // last ones): with MoE layers, their auxiliary loss, dropped assignments and expert loads
  StepMetrics m;
  lm().step_metrics(m);
  for (const StepMetrics::Metric& x : m.metrics()) trainer().log(x.name, StepMetrics::logged(x));
  // (validation runs this step without a graph: only training counts)
  if (cfg_.alignment.kind == AlignmentSection::Kind::sft && GradMode::is_enabled()) {
    const int64_t* t = batch.targets.data<int64_t>();
    const int64_t n = batch.targets.numel();
    const int64_t trained = n - std::count(t, t + n, kIgnoreIndex);
    trained_tokens_ += trained;
    masked_tokens_ += n - trained;
    trainer().log("sft_trained_tokens", static_cast<double>(trained_tokens_));
    trainer().log("sft_masked_tokens", static_cast<double>(masked_tokens_));
  }
  return loss;
}

trainer::OptimizerSetup optimizer_for(const TrainConfig& cfg,
                                      const std::vector<optim::NamedParam>& params) {
  const auto& o = cfg.optim;
  auto groups = trainer::param_groups_by_weight_decay(
      params, o.lr, o.weight_decay, {.do_layer_norm_weight_decay = o.do_layer_norm_weight_decay});
  trainer::OptimizerSetup s;
  if (o.name == "sgd")
    s.optimizer = std::make_unique<optim::SGD>(std::move(groups),
                                               optim::SGDOptions{o.momentum, 0.0, o.nesterov});
  else if (o.name == "lion")
    s.optimizer = std::make_unique<optim::Lion>(
        std::move(groups), optim::LionOptions{.beta1 = o.beta1, .beta2 = o.beta2});
  else
    // with ZeRO-1 the NxDOptimizer replaces this AdamW by Zero1AdamW: its state never exists
    s.optimizer = std::make_unique<optim::AdamW>(
        std::move(groups),
        optim::AdamWOptions{
            .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .defer_state = cfg.dist.zero1()});
  s.schedule = optim::LRSchedule({optim::schedule_kind_from_name(o.sched_name), o.lr, o.min_lr,
                                  o.warmup_steps, o.decay_steps});
  return s;
}

trainer::OptimizerSetup CausalLMModule::configure_optimizers() {
  return optimizer_for(cfg_, local_parameters());
}

std::string CausalLMModule::transformer_layer_type() const {
  return cfg_.model.arch == "gpt_neox" ? "GPTNeoXLayer" : "LlamaDecoderLayer";
}

std::unique_ptr<trainer::DatasetDataModule> make_data_module(const TrainData& data,
                                                             const TrainConfig& cfg) {
  return std::make_unique<trainer::DatasetDataModule>(
      data.train, data.val,
      trainer::DatasetDataOptions{cfg.data.micro_batch_size, cfg.seed, cfg.data.shuffle},
      data.description);
}

std::string summarize_skipped(const std::vector<SkippedFile>& skipped) {
  if (skipped.empty()) return "";
  std::map<std::string, std::vector<std::string>> by_kind;  // "binary" -> names
  for (const auto& s : skipped) {
    const std::string kind = s.reason.substr(0, s.reason.find(':'));
    by_kind[kind].push_back(fs::path(s.path).filename().string());
  }
  std::string out = str("skipped ", skipped.size(), " file(s):");
  bool first = true;
  for (const auto& [kind, names] : by_kind) {
    out += str(first ? " " : "; ", names.size(), " ", kind, " (");
    for (size_t i = 0; i < names.size() && i < 3; ++i) out += (i ? ", " : "") + names[i];
    if (names.size() > 3) out += ", ...";
    out += ")";
    first = false;
  }
  return out;
}

// The byte tokens of a text corpus re-tokenized by data.tokenizer (ConfigError when the model's
// vocabulary does not cover the tokenizer's ids).
std::shared_ptr<const io::Tokenizer> tokenize_corpus(Corpus& corpus, const std::string& path,
                                                     const TrainConfig& cfg) {
  auto tok = std::make_shared<const io::Tokenizer>(io::Tokenizer::from_file(path));
  if (tok->vocab_size() > cfg.model.vocab_size)
    throw ConfigError(str("[data] data.tokenizer ", path, " has ", tok->vocab_size(),
                          " ids but model.vocab_size=", cfg.model.vocab_size));
  std::string text(corpus.tokens.size(), '\0');
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>(corpus.tokens[i]);
  const std::vector<int64_t> ids = tok->encode(text);
  corpus.tokens.assign(ids.begin(), ids.end());
  corpus.vocab_size = tok->vocab_size();
  return tok;
}

TrainData build_data(const TrainConfig& cfg) {
  if (cfg.alignment.kind != AlignmentSection::Kind::none) return build_alignment_data(cfg);
  const auto& d = cfg.data;
  TrainData td;
  std::shared_ptr<const trainer::Dataset> all;
  if (d.kind == "random") {
    all = std::make_shared<trainer::RandomDataset>(d.random_num_samples, d.seq_length,
                                                   cfg.model.vocab_size, cfg.seed);
    td.description = str("random tokens (vocab ", cfg.model.vocab_size, "), ",
                         with_commas(d.random_num_samples), " samples");
  } else {
    auto corpus = std::make_shared<Corpus>(
        d.kind == "text"
            ? load_text_corpus(d.path)
            : load_token_file(d.path, d.token_dtype == "uint16" ? 2 : 4, cfg.model.vocab_size));
    if (!d.tokenizer.empty()) td.tokenizer = tokenize_corpus(*corpus, d.tokenizer, cfg);
    td.skipped = corpus->skipped;
    all = std::make_shared<CorpusDataset>(corpus, d.seq_length, str("corpus '", d.path, "'"));
    td.description = str(with_commas(static_cast<int64_t>(corpus->tokens.size())),
                         d.kind == "text" && !td.tokenizer ? " bytes" : " tokens", " from ",
                         corpus->files.size(), " file(s) in ", d.path,
                         td.tokenizer ? " (" + td.tokenizer->description() + ")" : "");
  }
  trainer::Split sp = trainer::split_dataset(all, d.val_fraction, cfg.seed);
  td.train = sp.train;
  td.val = sp.val;
  td.description +=
      str("; ", with_commas(td.train->size()), " train / ",
          with_commas(td.val ? td.val->size() : 0), " val samples of ", d.seq_length, "+1 tokens");
  return td;
}

}  // namespace nxd::train_app

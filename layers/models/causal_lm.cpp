#include "nxd/layers/models/causal_lm.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "nxd/autograd/function.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/gpt_neox.h"
#include "nxd/layers/models/llama.h"
#include "nxd/layers/moe/moe.h"
#include "nxd/layers/packed_documents.h"
#include "nxd/layers/parallel/context_parallel.h"
#include "nxd/layers/parallel/cross_entropy.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/parallel/mappings.h"
#include "nxd/layers/param_unit.h"
#include "nxd/runtime/context.h"

namespace nxd {

CausalLM::CausalLM(const ModelConfig& cfg, std::string type_name, const ModelPart& part)
    : Module(std::move(type_name)), cfg_(cfg), part_(part), tp_size_(model_tensor_parallel_size()) {
  cfg_.validate();
  cfg_.validate_parallel(tp_size_);
  part_.validate(cfg_);
  part_.layer_end = part_.end(cfg_);
  sequence_parallel_ = cfg_.sequence_parallel && tp_size_ > 1;
  cp_group_ = model_context_parallel_group();
  cp_size_ = cp_group_ ? cp_group_->size() : 1;
}

void CausalLM::check_whole(const char* what) const {
  NXD_CHECK(is_whole(), "[", type_name(), "::", what, "] needs the whole model; this one is ",
            part_.str(cfg_));
}

Tensor CausalLM::body(const Tensor& ids, int64_t position_offset) {
  return final_norm(release_root_after_backward(*this, root_uses_,
                                                run_layers(embed_tokens(ids), position_offset)));
}

void CausalLM::register_decoder_stack(const std::string& name,
                                      std::shared_ptr<DecoderStack> stack) {
  decoder_stack_ = register_module(name, std::move(stack));
}

const DecoderStack& CausalLM::stack(const char* what) const {
  NXD_CHECK(decoder_stack_, "[", type_name(), "::", what,
            "] registers no DecoderStack: a family without one overrides embed_tokens, run_layers, "
            "final_norm and embedding_weight");
  return *decoder_stack_;
}

Tensor CausalLM::embed_tokens(const Tensor& ids) {
  return stack("embed_tokens").embed(ids);
}

Tensor CausalLM::run_layers(const Tensor& h, int64_t position_offset) {
  return stack("run_layers").run_layers(h, position_offset);
}

Tensor CausalLM::final_norm(const Tensor& h) {
  return stack("final_norm").final_norm(h);
}

const Tensor& CausalLM::embedding_weight() const {
  return stack("embedding_weight").embedding_weight();
}

void CausalLM::register_output_head(const std::string& name) {
  if (cfg_.tie_word_embeddings || !part_.head) return;
  // loss() runs it on the local hidden states at TP > 1 (NxD's canonical head: SP all-gather
  // saving only the local shard); lm_head() uses its weight on full hidden states.
  head_name_ = name;
  head_ = register_module(name, std::make_shared<ColumnParallelLinear>(
                                    cfg_.hidden_size, cfg_.vocab_size,
                                    ColumnParallelLinearOptions{
                                        .bias = false,
                                        .gather_output = false,
                                        .sequence_parallel_enabled = sequence_parallel_,
                                        .weight_init = cfg_.init_scheme().weight(),
                                        .param = {cfg_.dtype, cfg_.device},
                                    }));
}

const Tensor& CausalLM::output_weight() const {
  return head_ ? head_->weight() : embedding_weight();
}

QuantizableLinear& CausalLM::output_head_weights() {
  return head_ ? static_cast<QuantizableLinear&>(*head_) : tied_head_;
}

const QuantizableLinear& CausalLM::output_head_weights() const {
  return head_ ? static_cast<const QuantizableLinear&>(*head_) : tied_head_;
}

std::vector<std::pair<std::string, const QuantizableLinear*>> CausalLM::owned_quantized() const {
  if (head_ || !tied_head_.quantized()) return {};
  return {{"lm_head", &tied_head_}};
}

namespace {

// ids [B,S] -> [B,Sp] with `value` at positions >= S (raw: ids carry no graph).
Tensor pad_sequence(const Tensor& ids, int64_t padded, double value) {
  if (ids.size(1) == padded) return ids;
  Tensor out = full({ids.size(0), padded}, value, ids.dtype(), ids.device());
  out.narrow(1, 0, ids.size(1)).copy_(ids);
  return out;
}

}  // namespace

Tensor CausalLM::hidden_states(const Tensor& ids, int64_t position_offset) {
  check_whole("hidden_states");
  check_ids(ids, position_offset);
  const RootUnitScope root(*this, root_uses_);
  if (!sequence_parallel_) return body(ids, position_offset);
  const int64_t S = ids.size(1), Sp = (S + tp_size_ - 1) / tp_size_ * tp_size_;
  // the downstream computation is duplicated on every rank: backward keeps this rank's chunk
  Tensor h = gather_from_sequence_parallel_region(body(pad_sequence(ids, Sp, 0), position_offset),
                                                  1, /*to_model_parallel=*/false);
  return Sp == S ? h : narrow(h, 1, 0, S);
}

Tensor CausalLM::forward(const Tensor& ids) {
  const RootUnitScope root(*this, root_uses_);
  return lm_head(hidden_states(ids));
}

Tensor CausalLM::lm_head(const Tensor& hidden) {
  check_whole("lm_head");
  const RootUnitScope root(*this, root_uses_);
  const QuantizableLinear& head = output_head_weights();
  if (tp_size_ == 1) return head.weight_product(hidden, output_weight(), Tensor());
  // X (duplicated) -> local vocab columns -> all-gathered: dX is all-reduced, each rank keeps the
  // gradient of its own columns.
  return gather_from_tensor_model_parallel_region(
      head.weight_product(copy_to_tensor_model_parallel_region(hidden), output_weight(), Tensor()));
}

void CausalLM::check_ids(const Tensor& ids, int64_t position_offset) const {
  NXD_CHECK_SHAPE(ids.dim() == 2, "[", type_name(), "] ids must be [B,S], got ", ids.desc());
  NXD_CHECK(ids.dtype() == DType::i64 || ids.dtype() == DType::i32, "[", type_name(),
            "] ids must be i32 or i64, got ", ids.desc());
  const int64_t seq = ids.size(1) * cp_size_;  // the whole sequence under context parallelism
  NXD_CHECK(position_offset >= 0 && position_offset + seq <= cfg_.max_position_embeddings, "[",
            type_name(), "] positions [", position_offset, ", ", position_offset + seq,
            ") exceed max_position_embeddings=", cfg_.max_position_embeddings);
  // SP pads a sequence to a multiple of TP at its end: under CP that would be inside the sequence
  NXD_CHECK_SHAPE(cp_size_ == 1 || !sequence_parallel_ || ids.size(1) % tp_size_ == 0, "[",
                  type_name(), "] context parallelism with sequence parallelism needs each rank's ",
                  ids.size(1), " tokens to divide by tensor parallel size ", tp_size_,
                  ": ids=", ids.desc(), " (context parallel size ", cp_size_, ")");
  // ... and the MoE layers would route the padding tokens: in training they would count in the
  // auxiliary loss, and with a capacity they could take real tokens' slots. Without a graph and
  // with dropless routing (generation, evaluation) a padding token changes no real token's output.
  const bool pads_harmless = !GradMode::is_enabled() && cfg_.moe.dropless;
  NXD_CHECK_SHAPE(
      !cfg_.moe.enabled() || !sequence_parallel_ || ids.size(1) % tp_size_ == 0 || pads_harmless,
      "[", type_name(), "] mixture of experts with sequence parallelism needs the ", ids.size(1),
      " tokens to divide by tensor parallel size ", tp_size_,
      " in training or with a capacity (dropless=false): ids=", ids.desc());
}

Tensor CausalLM::loss(const Tensor& ids, const Tensor& targets, const CrossEntropyOptions& opts) {
  check_whole("loss");
  NXD_CHECK_SHAPE(targets.shape() == ids.shape(), "[", type_name(),
                  "::loss] targets must match ids: ids=", ids.desc(), " targets=", targets.desc());
  const RootUnitScope root(*this, root_uses_);
  Tensor l = head_loss(decoder_layers(embed(ids)), targets, opts);
  Tensor aux = opts.reduction == Reduction::none ? Tensor() : moe_aux_loss();
  return aux.defined() ? add(l, to(aux, l.dtype())) : l;
}

Tensor CausalLM::moe_aux_loss() {
  if (!cfg_.moe.enabled()) return Tensor();
  Tensor total;
  for (const MoeMlp* m : moe_layers(*this)) {
    const Tensor& a = m->aux_loss();
    if (a.defined()) total = total.defined() ? add(total, a) : a;
  }
  return total;
}

void CausalLM::step_metrics(StepMetrics& out) {
  if (cfg_.moe.enabled()) add_moe_step_metrics(*this, out);
}

Tensor CausalLM::embed(const Tensor& ids) {
  NXD_CHECK(part_.embedding, "[", type_name(), "::embed] this part (", part_.str(cfg_),
            ") has no embedding");
  check_ids(ids, 0);
  const RootUnitScope root(*this, root_uses_);
  if (!sequence_parallel_) return embed_tokens(ids);
  return embed_tokens(pad_sequence(ids, (ids.size(1) + tp_size_ - 1) / tp_size_ * tp_size_, 0));
}

Tensor CausalLM::decoder_layers(const Tensor& h, int64_t position_offset) {
  return run_layers(h, position_offset);
}

Tensor CausalLM::head_loss(const Tensor& h_local, const Tensor& targets,
                           const CrossEntropyOptions& opts) {
  const RootUnitScope root(*this, root_uses_);
  if (!cp_group_ || opts.reduction == Reduction::none)
    return local_head_loss(h_local, targets, opts);
  CrossEntropyOptions sum_opts = opts;
  sum_opts.reduction = Reduction::sum;
  Tensor s = local_head_loss(h_local, targets, sum_opts);
  if (opts.reduction == Reduction::sum) return context_parallel_sum_loss(s, *cp_group_);
  int64_t counted = targets.numel();  // meta targets (the planner): every token counts
  if (!targets.is_meta()) {
    counted = 0;
    for (double t : targets.detach().to_vector()) counted += int64_t(t) != opts.ignore_index;
  }
  return context_parallel_mean_loss(s, counted, *cp_group_);
}

Tensor CausalLM::local_head_loss(const Tensor& h_local, const Tensor& targets,
                                 const CrossEntropyOptions& opts) {
  NXD_CHECK(part_.head, "[", type_name(), "::head_loss] this part (", part_.str(cfg_),
            ") has no head");
  NXD_CHECK_SHAPE(targets.dim() == 2 && h_local.dim() == 3 && targets.size(0) == h_local.size(0),
                  "[", type_name(), "::head_loss] targets [B,S] for hidden states [B,S,hidden]: ",
                  "targets=", targets.desc(), " hidden=", h_local.desc());
  const int64_t B = targets.size(0), S = targets.size(1);
  const int64_t Sp = sequence_parallel_ ? (S + tp_size_ - 1) / tp_size_ * tp_size_ : S;
  NXD_CHECK_SHAPE(h_local.size(1) * (sequence_parallel_ ? tp_size_ : 1) == Sp, "[", type_name(),
                  "::head_loss] hidden states ", h_local.desc(), " do not match targets ",
                  targets.desc());
  // [B,S(/tp),hidden]; the root's weights are read for the last time in this backward
  Tensor h = final_norm(release_root_after_backward(*this, root_uses_, h_local));
  if (tp_size_ == 1) {
    Tensor logits = output_head_weights().weight_product(h, output_weight(), Tensor());  // [B,S,V]
    const int64_t n = B * S;
    return cross_entropy(view(logits, {n, cfg_.vocab_size}), targets.reshape({n}), opts);
  }
  // column-parallel head, gather_output=false: [B,Sp,V/tp] (SP: all-gather the sequence first,
  // its backward reduce-scatters; else copy_to, whose backward all-reduces). A tied head does
  // the same with the embedding's vocabulary shard.
  Tensor logits;
  if (head_) {
    logits = head_->forward(h);
  } else {
    Tensor x = sequence_parallel_
                   ? gather_from_sequence_parallel_region(h, 1, /*to_model_parallel=*/true)
                   : copy_to_tensor_model_parallel_region(h);
    logits = tied_head_.weight_product(x, output_weight(), Tensor());
  }
  const int64_t np = B * Sp;
  ParallelCrossEntropyOptions po;
  po.ignore_index = opts.ignore_index;
  po.label_smoothing = opts.label_smoothing;
  po.reduction = opts.reduction;
  Tensor l = parallel_cross_entropy(
      view(logits, {np, logits.size(-1)}),
      pad_sequence(targets, Sp, static_cast<double>(opts.ignore_index)).reshape({np}), po);
  if (opts.reduction != Reduction::none || Sp == S) return l;
  return reshape(narrow(view(l, {B, Sp}), 1, 0, S), {B * S});
}

Tensor hidden_dropout(const Dropout& d, const Tensor& x, bool sequence_parallel) {
  if (!d.is_training() || d.p() == 0.0) return d.forward(x);
  const std::shared_ptr<Communicator> cp = model_context_parallel_group();
  Communicator* tp =
      sequence_parallel ? &parallel_state::get_tensor_model_parallel_group() : nullptr;
  if (tp && tp->size() == 1) tp = nullptr;
  if (!tp && !cp) return d.forward(x);
  const RngStream st = current_context().rng().next();
  const DType ct = x.dtype() == DType::f64 ? DType::f64 : DType::f32;  // mask as dropout computes
  Shape full = x.shape();
  const int64_t local = full.at(1);
  full[1] = local * (tp ? tp->size() : 1) * (cp ? cp->size() : 1);
  Tensor mask;
  {
    NoGradGuard ng;
    // the single rank's mask of the whole sequence; CP: this rank's chunks; SP: its TP shard
    mask = dropout(ones(full, ct, x.device()), d.p(), /*training=*/true, &st);
    if (cp) mask = context_parallel_slice(mask, 1, cp->rank(), cp->size());
    if (tp) mask = mask.narrow(1, tp->rank() * local, local).contiguous();
  }
  return x.dtype() == ct ? mul(x, mask) : to(mul(to(x, ct), mask), x.dtype());
}

DecoderStack::DecoderStack(std::string type_name, const ModelConfig& c, const ModelPart& part,
                           const DecoderStackOptions& o)
    : Module(std::move(type_name)),
      sequence_parallel_(c.sequence_parallel && model_tensor_parallel_size() > 1),
      recompute_layers_(c.activations_checkpoint_granularity == CheckpointGranularity::full) {
  // a tied head's weight is the embedding: the last stage holds it too
  if (part.embedding || (part.head && c.tie_word_embeddings)) {
    embedding_ = register_module(
        o.embedding,
        std::make_shared<ParallelEmbedding>(c.vocab_size, c.hidden_size,
                                            ParallelEmbeddingOptions{
                                                .sequence_parallel_enabled = sequence_parallel_,
                                                .weight_init = c.init_scheme().embedding(),
                                                .param = {c.dtype, c.device},
                                            }));
    embedding_weight_ = embedding_->weight();
    embedding_is_head_ = part.head && c.tie_word_embeddings;
  }
  if (!o.embedding_dropout.empty())
    embedding_dropout_ = register_module(o.embedding_dropout, std::make_shared<Dropout>(c.dropout));
  layers_ = register_module("layers", std::make_shared<ModuleList>(part.layer_begin));
  for (int64_t l = part.layer_begin; l < part.end(c); ++l) layers_->push_back(o.make_layer(l));
  if (part.head) final_norm_ = register_module(o.final_norm, o.make_final_norm());
}

Module* DecoderStack::lookup_unit_module() const {
  return embedding_is_head_ ? nullptr : embedding_.get();
}

Tensor DecoderStack::embed(const Tensor& ids) const {
  NXD_CHECK(embedding_, "[", type_name(), "::embed] this part has no embedding");
  // ZeRO-3: the embedding gathered for the lookup alone (its backward reads no weight)
  Tensor h = run_lookup_unit(*embedding_, [&] { return embedding_->forward(ids); });
  return embedding_dropout_ ? hidden_dropout(*embedding_dropout_, h, sequence_parallel_) : h;
}

Tensor DecoderStack::run_layers(const Tensor& h, int64_t position_offset) const {
  Tensor x = h;
  for (const auto& layer : *layers_) {
    const auto& l = static_cast<const DecoderLayer&>(*layer);
    l.mark_checkpointed_forward();  // a layer selected by class (apply_activation_checkpoint)
    const bool recompute = recompute_layers_ || l.recomputes_activations();
    // a ZeRO-3 unit (layers/param_unit.h) gathers the layer's parameters around it
    x = run_param_unit(l, x, [&l, recompute, position_offset](const Tensor& in) {
      return recompute
                 ? recompute_layer([&l, position_offset](
                                       const Tensor& y) { return l.forward(y, position_offset); },
                                   in)
                 : l.forward(in, position_offset);
    });
  }
  return x;
}

Tensor DecoderStack::run_layers_cached(const Tensor& h, const CacheStep& step,
                                       KVCache& cache) const {
  Tensor x = h;
  size_t i = 0;
  for (const auto& layer : *layers_) {
    const auto& l = static_cast<const DecoderLayer&>(*layer);
    // ZeRO-3: each layer gathered for its step and released after it (generation holds one or
    // two layers, not the model)
    x = run_param_unit(l, x, [&l, &step, &cache, i](const Tensor& in) {
      return l.forward_cached(in, step, cache.k.at(i), cache.v.at(i));
    });
    ++i;
  }
  return x;
}

Tensor DecoderStack::final_norm(const Tensor& h) const {
  NXD_CHECK(final_norm_, "[", type_name(), "::final_norm] this part has no final norm");
  return final_norm_->forward(h);
}

Tensor recompute_layer(const std::function<Tensor(const Tensor&)>& layer, const Tensor& h) {
  // packed documents: the rerun in backward sees the forward's positions
  return autograd::recompute(
      [layer,
       docs = current_document_positions()](const std::vector<Tensor>& x) -> std::vector<Tensor> {
        const DocumentScope scope(docs);
        return {layer(x[0])};
      },
      {h})[0];
}

bool is_builtin_arch(const std::string& arch) {
  return is_llama_family(arch) || arch == "gpt_neox";
}

std::shared_ptr<CausalLM> make_causal_lm(const ModelConfig& cfg, uint64_t seed,
                                         const ModelPart& part) {
  cfg.validate();
  if (!is_builtin_arch(cfg.arch))
    throw ConfigError(str("[make_causal_lm] unknown arch '", cfg.arch,
                          "' (built in: llama, gpt_neox, mixtral, qwen2, qwen3, mistral; another "
                          "architecture derives CausalLM, "
                          "as examples/new_model does)"));
  std::shared_ptr<CausalLM> m;
  if (is_llama_family(cfg.arch)) {
    m = std::make_shared<LlamaForCausalLM>(cfg, part);
  } else {
    m = std::make_shared<GPTNeoXForCausalLM>(cfg, part);
  }
  m->init_parameters(seed);
  return m;
}

}  // namespace nxd

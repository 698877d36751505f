#pragma once
// CausalLM: a decoder-only language model (ids -> next-token logits), its loss, and generation;
// DecoderStack: the body the built-in families share (embedding, decoder layers, final norm).
// The families are in llama.h and gpt_neox.h; make_causal_lm builds one from a ModelConfig.
//
// Tensor parallelism: a model is built over the parallel_state TP group current at construction
// (tensor_parallel_size()); every rank of the group must build it, with the same config and seed,
// and call its methods in lockstep. With one TP rank the model is exactly the plain one. With
// TP > 1 (docs/NXD_INTERNALS.md; layout in transformer.h):
//   - the parameters keep the plain model's names; each is this rank's shard of the plain
//     model's parameter of that name, initialized as that slice. parallel_parameters(model)
//     (layers/parallel/attributes.h) says how each is split: gather a tensor_model_parallel one
//     along partition_dim; a K/V weight with kv_replicas = m > 1 gathers to m identical copies of
//     each block (replicas r, r+1, ..., r+m-1 hold block r/m; their gradients are kept equal by
//     the backward all-reduce over the replica group): the full weight, and its full gradient,
//     is the first replica of every block (not the sum); everything else is duplicated.
//   - embeddings are vocabulary-parallel (ParallelEmbedding), the output head column-parallel
//     over the vocabulary (a tied head reuses the embedding shard); norms are Parallel norms.
//   - sequence_parallel: hidden states are split along the sequence between the tensor-parallel
//     regions (the embedding reduce-scatters, norms and residuals run on the shard, column layers
//     gather, row layers reduce-scatter). Ids whose length does not divide by TP are padded at the
//     end (causal: earlier positions are unaffected) and the padding is dropped from every result.
//     After backward, allreduce_sequence_parallel_gradients(model) must sum the gradients of the
//     parameters tagged sequence_parallel_enabled (norm weights and biases, row-parallel biases).
//   - loss() feeds the vocab-parallel logits to parallel_cross_entropy without gathering them;
//     forward()/lm_head() return the full logits (all-gathered), hidden_states() the full hidden
//     states, all identical on every rank and differentiable for a loss computed identically on
//     every rank.
//
// Context parallelism: a model is built over the parallel_state CP group current at construction
// (context_parallel_size()). Every method then takes this rank's rows of each sequence
// (layers/parallel/context_parallel.h: its two balanced chunks, context_parallel_slice of ids and
// of the shifted targets) and returns its rows; only attention talks to the other CP ranks (ring
// attention, rotary at the global positions). loss()/head_loss() with reduction mean or sum give
// the loss of the whole sequences, the same on every CP rank; its backward gives each rank
// context_parallel_size() times its share of the gradient, so the mean over the data x context
// group (what GradSync and ZeRO-1 reduce over) is the gradient of the loss (Megatron-core's
// loss x cp_size). Dropout masks are the single rank's (hidden_dropout); the KV-cache path and
// generation need CP 1.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nxd/autograd/ops.h"
#include "nxd/layers/basic.h"
#include "nxd/layers/models/config.h"
#include "nxd/layers/models/kv_cache.h"
#include "nxd/layers/module.h"
#include "nxd/layers/param_unit.h"
#include "nxd/layers/quantize.h"
#include "nxd/runtime/rng.h"

namespace nxd {

class ColumnParallelLinear;
class Communicator;
class DecoderStack;
class ParallelEmbedding;

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  double temperature = 1.0;   // 0 = greedy (argmax, first on ties)
  int64_t top_k = 0;          // > 0: sample among the k most likely tokens only
  double top_p = 1.0;         // < 1: then among the most likely tokens whose mass reaches top_p
  uint64_t seed = 0;          // sampling draws from RngStream{seed, stream_id("nxd.generate")}
  int64_t eos_token_id = -1;  // >= 0: stop after generating it
};

// What CausalLM::generate_batch returns: per prompt, the prompt followed by its generated ids and
// why it stopped; the times of the prefill (one forward_cached of all prompts) and of the decode
// steps (wall clock, and modeled by the sim device when the rank runs on it, else 0).
struct GenerateResult {
  std::vector<std::vector<int64_t>> sequences;
  // "max_new_tokens", "eos", or "max_position_embeddings" (the sequence reached the model's
  // maximum length before max_new_tokens: generation stops rather than slide the window)
  std::vector<std::string> stop_reasons;
  int64_t prefill_tokens = 0;  // real prompt tokens
  int64_t decode_steps = 0;    // forward_cached calls after the prefill
  int64_t decode_tokens = 0;   // tokens those steps fed (rows active in each step)
  double prefill_seconds = 0, decode_seconds = 0;
  double modeled_prefill_seconds = 0, modeled_decode_seconds = 0;
};

class CausalLM : public Module, public QuantizedWeightOwner {
 public:
  // Validates cfg, cfg.validate_parallel(TP) and part (ConfigError).
  CausalLM(const ModelConfig& cfg, std::string type_name, const ModelPart& part = {});
  const ModelConfig& config() const { return cfg_; }
  int tensor_parallel_size() const { return tp_size_; }
  bool sequence_parallel() const { return sequence_parallel_; }  // cfg.sequence_parallel && TP > 1
  int context_parallel_size() const { return cp_size_; }
  const ModelPart& part() const { return part_; }
  bool is_whole() const { return part_.whole(cfg_); }

  // ids [B,S] i32/i64 -> final hidden states [B,S,hidden] (after the final norm). Positions are
  // position_offset + [0, S); S + position_offset must not exceed max_position_embeddings.
  virtual Tensor hidden_states(const Tensor& ids, int64_t position_offset = 0);
  // [..., hidden] -> logits [..., vocab] (the output head).
  virtual Tensor lm_head(const Tensor& hidden);
  // ids [B,S] -> logits [B,S,V].
  virtual Tensor forward(const Tensor& ids);

  // Cross entropy of forward(ids) against targets [B,S] (already shifted by the caller): the mean
  // over targets != opts.ignore_index by default. TP > 1: vocab-parallel (parallel_cross_entropy),
  // the same value on every rank.
  // With mixture-of-experts layers (cfg.moe) the mean loss also includes moe_aux_loss().
  Tensor loss(const Tensor& ids, const Tensor& targets, const CrossEntropyOptions& opts = {});

  // Mixture of experts: the sum of this part's MoE layers' auxiliary losses (coefficients applied)
  // from their last forward, a scalar in the graph; undefined for a dense model. loss() adds it;
  // a pipeline stage's caller must add it itself.
  Tensor moe_aux_loss();
  // Mixture of experts: the MoE layers' figures of the last forward (add_moe_step_metrics);
  // a dense model reports none.
  void step_metrics(StepMetrics& out) override;

  // ---- the pieces a pipeline stage runs (hidden states in the local layout: [B,S,hidden], or
  // this rank's sequence shard [B,Sp/TP,hidden] under SP, Sp = S rounded up to a multiple of TP).
  // loss(ids, targets) == head_loss(decoder_layers(embed(ids)), targets) exactly. ----
  // ids [B,S] -> embedded hidden states (needs part().embedding).
  Tensor embed(const Tensor& ids);
  // This part's decoder layers.
  Tensor decoder_layers(const Tensor& h, int64_t position_offset = 0);
  // Final norm, output head and cross entropy against targets [B,S] (needs part().head).
  Tensor head_loss(const Tensor& h, const Tensor& targets, const CrossEntropyOptions& opts = {});

  // ---- the KV-cache path (kv_cache.h has the contract; docs/design/generation.md "KV cache and
  // generation"). Forward only, without a graph, in whatever mode the model is (dropout is not
  // applied); needs the whole model and no sequence parallelism.
  // K/V heads of this rank's cache (the attention's local_kv_heads()).
  virtual int64_t cache_kv_heads() const;
  // One K and one V per decoder layer, [max_batch, cache_kv_heads(), max_len, head_dim] in the
  // model's dtype on its device (zeros on the host); max_len <= max_position_embeddings.
  KVCache make_kv_cache(int64_t max_batch, int64_t max_len) const;
  // The paged layout (kv_cache.h): K and V [num_blocks, cache_kv_heads(), block_size, head_dim]
  // per layer; forward_cached then needs CacheSteps with block_tables.
  KVCache make_paged_kv_cache(int64_t num_blocks, int64_t block_size) const;
  // ids [B,S] i32/i64 (rows right-padded), step's rows as kv_cache.h says: writes the real
  // tokens' K/V at [start, start+len) of cache row seq_ids[b] in place and returns the logits
  // [B, V] of each row's last real token (the full vocabulary on every TP rank).
  Tensor forward_cached(const Tensor& ids, const CacheStep& step, KVCache& cache);
  // forward_cached returning the logits of every position, [B, S, V] (a padded position's row is
  // not meaningful): what a speculative verification step needs (layers/models/speculative.h).
  Tensor forward_cached_all(const Tensor& ids, const CacheStep& step, KVCache& cache);

  // hidden_states, lm_head, forward, loss and generate need the whole model (InvalidArgument).
  // Each prompt followed by up to max_new_tokens generated ids, with the KV cache: one prefill
  // of all prompts (right-padded), then one decode step per token for the rows still running
  // (rows leave the batch when they stop). Runs without a graph and in eval mode (restored).
  // Row b samples with u = RngStream{seed, stream_id("nxd.generate")}.uniform_f64(i) for its
  // i-th new token, so a batch gives each prompt exactly what it gives alone. A sequence stops at
  // max_position_embeddings (stop reason says so). A model built with sequence parallelism falls
  // back to rerunning the whole sequence for every token (no cache), with the same semantics, as
  // does a family without a KV-cache path (a user's CausalLM subclass).
  GenerateResult generate_batch(const std::vector<std::vector<int64_t>>& prompts,
                                const GenerateOptions& opts);
  // generate_batch of one prompt: its sequence.
  std::vector<int64_t> generate(const std::vector<int64_t>& prompt, const GenerateOptions& opts);

  // The name of the untied output head module (empty when tied to the embedding).
  const std::string& output_head_name() const { return head_name_; }
  bool output_head_tied() const { return head_ == nullptr; }
  // The output head as a QuantizableLinear (layers/quantize.h): the head module, or when tied to
  // the embedding a holder of the head's own quantized copy (quantize_output_head,
  // layers/models/quantize_lm.h), the f32/bf16 embedding staying for the input lookup. lm_head
  // and head_loss multiply through it: the quantized weight once one is set, else the weight.
  QuantizableLinear& output_head_weights();
  const QuantizableLinear& output_head_weights() const;
  // The output head's weight: the head's parameter "weight", or the embedding's when tied (this
  // rank's vocabulary rows at TP > 1).
  const Tensor& output_head_weight() const { return output_weight(); }
  // A tied head's quantized copy, as "lm_head" (quantized_tensors, resident_weight_bytes).
  std::vector<std::pair<std::string, const QuantizableLinear*>> owned_quantized() const override;

  // The body of the built-in families, null for a user's family that overrides the pieces below.
  const DecoderStack* decoder_stack() const { return decoder_stack_.get(); }

 protected:
  // The body: ids [B,S] (S divisible by TP under sequence parallelism) -> final hidden states in
  // the local layout: [B,S,hidden], or this rank's sequence shard [B,S/TP,hidden] under SP:
  // final_norm(run_layers(embed_tokens(ids), position_offset)).
  Tensor body(const Tensor& ids, int64_t position_offset);
  // A family built on a DecoderStack registers it under its name ("model", "gpt_neox"); the
  // pieces below then run it. A family without one (examples/new_model) overrides them all but
  // run_layers_cached, whose default throws (generate then recomputes: supports_kv_cache()).
  void register_decoder_stack(const std::string& name, std::shared_ptr<DecoderStack> stack);
  virtual Tensor embed_tokens(const Tensor& ids);
  virtual Tensor run_layers(const Tensor& h, int64_t position_offset);
  virtual Tensor final_norm(const Tensor& h);
  // The decoder layers on the KV-cache path (kv_cache.h).
  virtual Tensor run_layers_cached(const Tensor& h, const CacheStep& step, KVCache& cache);
  virtual bool supports_kv_cache() const { return decoder_stack_ != nullptr; }
  // The input embedding's weight (this rank's vocabulary rows at TP > 1).
  virtual const Tensor& embedding_weight() const;
  // Registers the untied output head `name` (ColumnParallelLinear [V, hidden] without bias,
  // vocabulary-parallel: at TP 1 the plain Linear) unless cfg.tie_word_embeddings.
  void register_output_head(const std::string& name);
  // The output head's weight: the head's, or embedding_weight() when tied.
  const Tensor& output_weight() const;
  void check_ids(const Tensor& ids, int64_t position_offset) const;
  void check_whole(const char* what) const;
  void check_cached(const Tensor& ids, const CacheStep& step, const KVCache& cache,
                    const char* op) const;
  ModelConfig cfg_;
  ModelPart part_;
  std::shared_ptr<DecoderStack> decoder_stack_;
  int tp_size_ = 1;
  bool sequence_parallel_ = false;
  int cp_size_ = 1;
  std::shared_ptr<Communicator> cp_group_;  // null at CP 1
  // ZeRO-3's root unit (layers/param_unit.h): the entry points below that read the embedding,
  // the final norm or the head open a RootUnitScope; body() and head_loss() pass the final norm's
  // input through release_root_after_backward.
  RootUnitUses root_uses_;

 private:
  // head_loss on this rank's rows only (no reduction over CP).
  Tensor local_head_loss(const Tensor& h, const Tensor& targets, const CrossEntropyOptions& opts);
  void check_generate(const std::vector<std::vector<int64_t>>& prompts,
                      const GenerateOptions& opts) const;
  // The fallback without a cache (sequence-parallel models): reruns the sequence per token.
  GenerateResult generate_recompute(const std::vector<std::vector<int64_t>>& prompts,
                                    const GenerateOptions& opts);
  const DecoderStack& stack(const char* what) const;  // the registered one, or throws
  std::shared_ptr<ColumnParallelLinear> head_;        // null when tied
  QuantizableLinear tied_head_;  // a tied head's quantized copy (unset: the embedding's weight)
  std::string head_name_;
};

// A decoder layer of a family built on DecoderStack: hidden states [B,S,hidden] (under sequence
// parallelism this rank's shard) -> the same.
class DecoderLayer : public Module {
 public:
  using Module::Module;
  virtual Tensor forward(const Tensor& h, int64_t position_offset = 0) const = 0;
  // The KV-cache path (kv_cache.h): this layer's K/V cache tensors written in place.
  virtual Tensor forward_cached(const Tensor& h, const CacheStep& step, const Tensor& k_cache,
                                const Tensor& v_cache) const = 0;
};

// What a family's body is made of, with its Hugging Face names.
struct DecoderStackOptions {
  std::string embedding;          // the token embedding (vocabulary-parallel ParallelEmbedding)
  std::string embedding_dropout;  // "" for none, else hidden_dropout on the embedded states
  std::string final_norm;
  // Builds decoder layer `layer` (its index in the whole model) and the final norm.
  std::function<std::shared_ptr<DecoderLayer>(int64_t layer)> make_layer;
  std::function<std::shared_ptr<Norm>()> make_final_norm;
};

// The body of Llama and GPT-NeoX: {embedding, [embedding dropout], layers, final norm} registered
// in that order with the family's names, built over model_tensor_parallel_size(); with a ModelPart
// only that part's pieces exist (config.h; a last stage of a tied model holds the embedding for
// its head). Under sequence parallelism the embedding reduce-scatters and every later piece runs
// on this rank's sequence shard. cfg.activations_checkpoint_granularity full recomputes each layer
// in backward (recompute_layer), as does a layer selected by apply_activation_checkpoint.
class DecoderStack : public Module {
 public:
  DecoderStack(std::string type_name, const ModelConfig& cfg, const ModelPart& part,
               const DecoderStackOptions& opts);
  Tensor embed(const Tensor& ids) const;
  Tensor run_layers(const Tensor& h, int64_t position_offset = 0) const;
  Tensor run_layers_cached(const Tensor& h, const CacheStep& step, KVCache& cache) const;
  Tensor final_norm(const Tensor& h) const;
  // The embedding's weight (this rank's vocabulary rows at TP > 1); undefined without one.
  const Tensor& embedding_weight() const { return embedding_weight_; }
  const ModuleList& layers() const { return *layers_; }
  // ZeRO-3: the token embedding when its lookup alone reads its weight, which embed() then runs
  // as a lookup unit (run_lookup_unit, layers/param_unit.h); null without an embedding or when it
  // is a tied head's weight on this part (the root unit holds it then: the head reads it too).
  Module* lookup_unit_module() const;

 private:
  std::shared_ptr<ParallelEmbedding> embedding_;
  bool embedding_is_head_ = false;  // a tied head on this part reads the embedding's weight
  Tensor embedding_weight_;
  std::shared_ptr<Dropout> embedding_dropout_;
  std::shared_ptr<ModuleList> layers_;
  std::shared_ptr<Norm> final_norm_;
  bool sequence_parallel_ = false;
  bool recompute_layers_ = false;
};

// Dropout on a model's hidden states (d's p and mode). Under sequence parallelism x is this
// rank's shard [B, S/tp, ...] of [B, S, ...] and gets that slice of the mask a single rank draws
// for the full tensor from the same stream (every TP rank draws the full mask), so a
// sequence-parallel model matches the single-rank model with dropout too. Under context
// parallelism (parallel_state's CP group) likewise: x holds this rank's chunks of the sequence
// and gets those rows of the whole sequence's mask. Without it, the
// ranks of a TP group draw the single rank's masks as long as their Context seeds agree. (Ids
// padded for SP draw the mask of the padded length: equal to the single rank's when S % tp == 0.)
Tensor hidden_dropout(const Dropout& d, const Tensor& x, bool sequence_parallel);

// Full activation recomputation of one decoder layer: layer(h) under autograd::recompute (only h
// is kept; the layer reruns in backward).
Tensor recompute_layer(const std::function<Tensor(const Tensor&)>& layer, const Tensor& h);

// Picks the next token from one row of logits (exposed for tests): greedy when temperature == 0,
// else softmax(logits / temperature) restricted to the top_k largest (ties by lower id), sampled
// with the uniform number u in [0, 1).
int64_t sample_token(const std::vector<double>& logits, double temperature, int64_t top_k,
                     double u);
// The same with nucleus sampling: top_p in (0, 1] keeps, of those, the most likely tokens in
// decreasing probability (ties by lower id) up to and including the first whose cumulative
// probability reaches top_p, renormalized, and samples among them in that order with u. top_p = 1
// is exactly the four-argument form.
int64_t sample_token(const std::vector<double>& logits, double temperature, int64_t top_k,
                     double top_p, double u);

// The distribution sample_token draws from: the kept ids in the order the draw walks them and
// their weights (unnormalized, summing to z). Greedy (temperature 0): the first argmax alone.
// sample_token(logits, t, k, p, u) == token_distribution(logits, t, k, p).draw(u), bitwise.
struct TokenDistribution {
  std::vector<int64_t> ids;
  std::vector<double> w;
  double z = 0;
  double prob(int64_t id) const;  // w / z of id, 0 when it is not kept
  int64_t draw(double u) const;   // the first id whose running weight exceeds u * z
};
TokenDistribution token_distribution(const std::vector<double>& logits, double temperature,
                                     int64_t top_k, double top_p);

// One sequence being generated (by generate_batch, or a traced decoder): the prompt and the ids
// generated so far, and why it stopped ("" while it runs).
struct GenerationRow {
  std::vector<int64_t> seq;
  int64_t generated = 0;
  std::string stop;
};
// Samples r's next token from its logits with draw number r.generated of `stream` (so a row's
// tokens do not depend on the other rows of its batch), appends it, and sets r.stop to "eos",
// "max_new_tokens" or "max_position_embeddings" (the sequence reached max_pos) when it is done.
void advance_generation_row(GenerationRow& r, const std::vector<double>& logits,
                            const GenerateOptions& o, const RngStream& stream, int64_t max_pos);

// The families make_causal_lm builds: "llama" and "gpt_neox". ModelConfig::arch may name any
// other family a user's own CausalLM subclass implements (examples/new_model).
bool is_builtin_arch(const std::string& arch);

// Validates cfg (ConfigError) and builds the model of cfg.arch over the current TP group,
// parameters initialized by name from `seed`; with a part, only that part (its parameters have
// the whole model's names and values).
std::shared_ptr<CausalLM> make_causal_lm(const ModelConfig& cfg, uint64_t seed,
                                         const ModelPart& part = {});

}  // namespace nxd

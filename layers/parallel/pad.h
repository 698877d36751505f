#pragma once
// Attention head padding (NxD parallel_layers/pad.py: pad_model, get_number_of_extra_heads):
// when the number of attention heads does not divide the TP degree, add zero heads so that it
// does; the padded model computes the same function.
//
// Plan (plan_head_padding):
//   - multi-head (num_kv_heads == num_heads): pad both to the next multiple of tp (NxD's rule).
//   - grouped-query (H = Hkv * g): pad the KV heads to the smallest Hkv' >= Hkv that divides or
//     is divided by tp (so K/V can be sharded, or replicated with kv_size_multiplier = tp/Hkv'),
//     then each KV group's query heads to the smallest g' >= g with Hkv'*g' % tp == 0. Query
//     heads stay group-major (query head p reads KV head p / g'), new heads at the end of each
//     group, so every original query head keeps its original KV head.
// Padding (pad_model / pad_attention_state_dict): new q/k/v rows (and bias entries) are zero, and
// the output projection's columns for new heads are zero. A zero query attends uniformly and a
// zero key/value head yields zero, but whatever a padded head computes is multiplied by zero
// columns of o_proj/dense: outputs, the loss and the gradients of every original parameter are
// unchanged, and padded q/k/v rows get zero gradient.
// Caveat (as NxD, whose padding is meant for inference): with grouped-query attention a padded
// query head reads a real KV head, so the padded o_proj columns do get a gradient; training the
// padded model moves away from the original function unless those columns' gradients are zeroed
// (head_padding_mask gives the mask).
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "nxd/layers/models/config.h"
#include "nxd/layers/module.h"
#include "nxd/layers/module_class.h"
#include "nxd/layers/transformer.h"

namespace nxd {

// Heads to add so that num_heads divides tp (NxD's get_number_of_extra_heads).
int64_t get_number_of_extra_heads(int64_t num_heads, int64_t tp);

struct HeadPadding {
  int64_t num_heads = 0, num_kv_heads = 0;  // original
  int64_t padded_heads = 0, padded_kv_heads = 0;
  // For each padded query / KV head: the original head it holds, or -1 for a zero head.
  std::vector<int64_t> q_source, kv_source;
  bool needed() const { return padded_heads != num_heads || padded_kv_heads != num_kv_heads; }
};
HeadPadding plan_head_padding(int64_t num_heads, int64_t num_kv_heads, int64_t tp);

// The options of the padded attention (head_dim fixed explicitly, heads padded).
AttentionOptions pad_attention_options(const AttentionOptions& original, const HeadPadding& plan);

// Pads one attention's parameters in `state` (keys prefix + q_proj/k_proj/v_proj/o_proj, or
// query_key_value/dense for the fused GPT-NeoX layout); other keys are copied as they are.
StateDict pad_attention_state_dict(const StateDict& state, const std::string& prefix,
                                   const HeadPadding& plan, int64_t head_dim, QkvLayout layout);

// Every CausalSelfAttention of `model` padded for `tp` (all must have the same head counts):
// returns the padded state dict of the whole model, to load into the same model built with
// pad_attention_options (or ModelConfig heads set to plan.padded_heads/padded_kv_heads with the
// original head_dim). `plan` receives the plan (needed() is false when nothing was padded).
StateDict pad_model(Module& model, int64_t tp, HeadPadding* plan = nullptr);

// ---- NxD's pad_model(model, tp_degree, n_heads, wrapped_classes, pad_hook_fn): a user's class
// ---- What a pad hook gets for each module it pads (NxD passes the module and tgt_src_ratio; C++
// layers hold their sizes in their tensors, so the hook pads its own tensors in `state`).
struct PadHookArgs {
  Module& module;           // an instance of a wrapped class, or a module inside one
  const std::string& name;  // its hierarchical name ("" for the model itself)
  double tgt_src_ratio;     // padded heads / n_heads (NxD's argument)
  StateDict& state;         // the model's padded state so far, full tensors
};
using PadHookFn = std::function<void(const PadHookArgs&)>;

// NxD's generic pad_model on an unsharded model (its parallel layers built at TP 1: a one-rank
// build, or a checkpoint's full tensors loaded into one): n_heads is padded to the next multiple
// of tp_degree (tgt_src_ratio = padded / n_heads) by NxD's one-axis strategy. In every instance
// of `wrapped_classes` and every module inside one (the whole model when the list is empty),
// post-order as NxD: pad_hook_fn is called, then a ColumnParallelLinear's weight rows and bias
// and a RowParallelLinear's weight columns are extended by ratio with zeros at the end. With
// q/k/v/o projections whose heads are contiguous blocks, that appends zero heads: a padded model
// (the same classes built with the padded head count at any TP, loaded from the returned full
// state, e.g. ckpt::load_full_tensors) computes and trains as the original. Returns that state;
// `model` is left as it is. InvalidArgument naming the class when a wrapped class matches
// nothing, naming the layer when a parallel layer is sharded (tp_size > 1) or fused (stride > 1),
// or when a padded size is not whole.
StateDict pad_model(Module& model, int64_t tp_degree, int64_t n_heads,
                    const std::vector<ModuleClass>& wrapped_classes,
                    const PadHookFn& pad_hook_fn = nullptr);

// 1 for the columns of the padded attention's output projection that belong to original heads, 0
// for padded heads: [padded_heads * head_dim].
Tensor head_padding_mask(const HeadPadding& plan, int64_t head_dim);

// ---- padding a model that is built padded (NxDConfig::pad_model, initialize_parallel_model) ----
// The config of `cfg`'s model with its heads padded for `tp` (attention_head_dim fixed to the
// original head size, kv_size_multiplier max(1, tp / padded kv heads)); `plan` receives the plan.
// Returns cfg unchanged when nothing needs padding.
ModelConfig pad_model_config(const ModelConfig& cfg, int64_t tp, HeadPadding* plan);
// For a model built with padded head counts: zeroes, in every CausalSelfAttention, the padded
// heads' rows of q/k/v (weights and biases) and columns of the output projection, on this rank's
// shards (their init regions say where each shard sits), and registers a gradient hook that keeps
// the output projection's padded columns at zero gradient (a padded query head of grouped-query
// attention reads a real KV head, so those columns would otherwise train). The padded model then
// computes and trains as a model of the original head counts: padded q/k/v get zero gradients,
// and decoupled weight decay keeps zeros zero. Returns the number of attention modules padded.
int zero_padded_heads(Module& model, const HeadPadding& plan);

}  // namespace nxd

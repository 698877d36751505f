#pragma once
// LoRA adapters on the tensor-parallel linear layers (NxD's modules/lora: LoraConfig,
// LoraParallelLinear, LoraGQAQKVParallelLinear; PEFT's names and math).
//
// An adapted layer computes y = base(x) + scale * B(A(dropout(x))), A [r, in], B [out, r],
// scale = lora_alpha / r (use_rslora: lora_alpha / sqrt(r)). The adapter's two weights are
// registered on the layer as children "lora_A" and "lora_B" (parameter "weight"), so their names
// are PEFT's without its "base_model.model." prefix:
// "model.layers.0.self_attn.q_proj.lora_A.weight". A is initialized as torch.nn.Linear
// (uniform(+-1/sqrt(in)), the full in at every TP degree) or, with init_lora_weights = gaussian,
// normal(0, 1/r); B with zeros (the adapted model starts as the base). Values come from (seed, full
// parameter name, element index): a TP shard equals the slice of the one-rank tensor.
//
// Tensor parallelism, as NxD lays it out (y_r: the base layer's local output):
//   column-parallel base (ColumnParallelLinear, GQA q/k/v_proj): A replicated [r, in]; B split by
//     output rows like the base ([out/tp, r], a K/V projection's replicated block likewise).
//       h = A(dropout(x)) on every rank; then copy_to_tensor_model_parallel_region(h) (backward:
//       all-reduce dh over TP) or, under SP, gather_from_sequence_parallel_region(h) (all-gather
//       the r-wide h along the sequence, backward reduce-scatter), and y_r += scale * h B_r^T.
//       Under SP A's gradient is partial per rank: A is tagged sequence_parallel_enabled. A K/V
//       projection's B (kv_size_multiplier m > 1) is held by the m replicas: its gradient is
//       all-reduced over the KV-replica group in backward (copy_to_..._region(B, kv group)).
//   row-parallel base (RowParallelLinear): A split by input columns like the base ([r, in/tp]);
//     B replicated [out, r].
//       h = reduce_from_tensor_model_parallel_region(x_r A_r^T) (SP: reduce-scatter along the
//       sequence), y += scale * h B^T. Under SP B is tagged sequence_parallel_enabled.
// With one rank both are the plain y = x W^T + scale * (dropout(x) A^T) B^T, no collective.
// A gather_output layer adds the adapter before its gather; a fused column layer (stride > 1)
// at TP > 1 is refused.
//
// Dropout draws its mask from the context's generator (restored under activation recomputation,
// so recompute sees the same mask); masks depend on the local tensor, so a run with lora_dropout
// > 0 is not bitwise a one-rank run at TP > 1 (A row-parallel adapter drops each rank's shard).
//
// Freezing: apply_lora makes every other parameter of the model require no gradient (PEFT's
// freezing): backward computes no gradient for them, optimizers built after it (param groups from
// optim::default_param_groups) hold no state for them, and the DP buckets and ZeRO-1 shards cover
// the adapters only.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nxd/layers/parallel/attributes.h"

namespace nxd {

// NxD's LoraConfig (and NxD Training's model_alignment_strategy.peft) keys nxd implements.
struct LoraConfig {
  int64_t lora_rank = 16;
  double lora_alpha = 32.0;
  double lora_dropout = 0.05;
  // Module names: an entry selects every linear layer whose hierarchical name is the entry or ends
  // with "." + entry (PEFT's list form); "qkv_proj" (NxD's fused attention projection) selects
  // q_proj, k_proj and v_proj. target_regex (PEFT's string form) selects names it fully matches.
  std::vector<std::string> target_modules;
  std::string target_regex;
  enum class Init { standard, gaussian } init_lora_weights = Init::standard;
  bool use_rslora = false;
  bool merge_lora = false;  // merge the adapters into the base weights when exporting
  double scale() const;
  // ConfigError naming the value: rank < 1, alpha <= 0, dropout outside [0, 1), no targets.
  void validate() const;
};

// What a LoRA adapter needs of the layer it adapts (ParallelModule::lora_target()).
struct LoraTarget {
  enum class Style { column, row } style = Style::column;
  int64_t in = 0, out = 0;          // the full layer
  int64_t local_in = 0, in0 = 0;    // row: this rank's input columns [in0, in0 + local_in)
  int64_t local_out = 0, out0 = 0;  // column: this rank's output rows [out0, out0 + local_out)
  bool input_is_parallel = true;    // row: x is already this rank's columns
  bool sequence_parallel = false;   // x (column) or the output (row) is a sequence shard
  int64_t sequence_dimension = 1;
  int64_t kv_replicas = 1;                 // column: m ranks hold this rank's block of B
  std::shared_ptr<Communicator> group;     // the TP group
  std::shared_ptr<Communicator> kv_group;  // the KV-replica group when kv_replicas > 1
  ParamOptions param;                      // the base weight's dtype and device
  int64_t stride = 1;                      // fused column layout (refused at TP > 1)
};

class LoraAdapter {
 public:
  LoraAdapter(const LoraTarget& t, const LoraConfig& c);
  // scale * B(A(dropout(x))) in the base layer's local output layout (before a gather_output).
  Tensor delta(const Tensor& x) const;
  // scale * B_local A_local: the shape of the base layer's local weight (merging).
  Tensor delta_weight() const;
  const std::shared_ptr<ParallelModule>& lora_A() const { return a_; }
  const std::shared_ptr<ParallelModule>& lora_B() const { return b_; }
  double scale() const { return scale_; }
  const LoraConfig& config() const { return cfg_; }

 private:
  LoraTarget t_;
  LoraConfig cfg_;
  double scale_, dropout_;
  std::shared_ptr<ParallelModule> a_, b_;
};

// What apply_lora did.
struct LoraReport {
  std::vector<std::string> adapted;              // the layers' hierarchical names
  std::map<std::string, int64_t> entry_matches;  // target_modules entry (or the regex) -> layers
  int64_t trainable = 0, total = 0;              // parameter elements of this rank after it
};

// Adds an adapter to every linear layer of `root` the config selects, initializes the adapters
// from `seed` (names prefixed by `prefix`; meta parameters stay meta) and freezes every other
// parameter. ConfigError naming the layer for a selected module that is not a linear layer nxd can
// adapt, or one already adapted. Entries that match nothing are reported, not refused (a pipeline
// stage holds part of the model: check_lora_matches checks the whole).
LoraReport apply_lora(Module& root, const LoraConfig& cfg, uint64_t seed,
                      const std::string& prefix = "");
// ConfigError naming the entries of cfg that matched no layer in `reports` (every part of the
// model) and the linear layers there are.
void check_lora_matches(const LoraConfig& cfg, const std::vector<LoraReport>& reports,
                        const std::vector<Module*>& parts);

// The config of the first adapter in `root` (every adapter of a model has the same), or null.
const LoraConfig* find_lora_config(Module& root);

// The adapters' parameters of `root` (hierarchical names ending in .lora_A.weight /
// .lora_B.weight), registration order.
std::vector<std::pair<std::string, Tensor>> lora_parameters(Module& root);
// Whether a name is an adapter weight; the base weight it adapts ("x.lora_A.weight" -> "x.weight").
bool is_lora_name(const std::string& name);
std::string lora_base_name(const std::string& adapter_name);

// Merges full (unsplit) adapter tensors into their base weights in place: W += scale * B A for
// every "X.lora_A.weight" / "X.lora_B.weight" pair, which are then erased. InvalidArgument naming
// the tensor for a missing pair or base weight or mismatched shapes.
void merge_lora_weights(std::map<std::string, Tensor>& full, double scale);

}  // namespace nxd

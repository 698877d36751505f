#pragma once
// Tensor- and sequence-parallel layers (NxD parallel_layers/layers.py; the norms, which shard
// nothing, are LayerNorm and RMSNorm in layers/basic.h). Each is a ParallelModule whose parameters
// are this rank's shards, named like the plain layer in layers/basic.h ("weight", "bias"): with one
// TP rank a parallel layer has exactly the plain layer's parameters and computes exactly its
// result (the same ops: at TP 1 no collective and no extra graph node), and for any TP degree a
// rank's shard equals the slice of the weight the plain layer creates with the same name and seed
// (init by ParamInit::region). Biases that are not sharded are initialized as the unsharded layer's
// (same rule, same values).
//
// The group is options.group, default the current parallel_state TP group (captured at
// construction), or a group of this rank alone when parallel_state is not initialized (a model
// built without model parallelism, e.g. data-parallel only). Sizes that do not divide by the TP
// size throw ShapeError at construction, e.g.
// "[ColumnParallelLinear] output size 10 is not divisible by tensor parallel size 4".
//
// Sequence parallelism: activations outside the TP regions are split along the sequence
// dimension (options.sequence_dimension, default 1 for nxd's batch-first [B,S,H]; NxD defaults to
// 0 for its [S,B,H] models). Parameters whose gradient is then partial per rank are tagged
// sequence_parallel_enabled; call allreduce_sequence_parallel_gradients(model) after backward.
//
// The linear layers' options (here and GQAQKVColumnParallelLinearOptions in qkv.h) end with the
// same fields: weight_init and bias_init (PyTorch's and NxD's default, uniform(+-1/sqrt(in)), i.e.
// kaiming_uniform_(a=sqrt(5)), with in the full input size at every TP degree), param (dtype and
// device) and group. They are fields of each struct, not of a shared base, so that designated
// initializers can name them.
#include <cstdint>
#include <memory>
#include <utility>

#include "nxd/autograd/ops.h"
#include "nxd/layers/basic.h"  // LayerNorm, RMSNorm: the norms of a parallel model
#include "nxd/layers/parallel/attributes.h"
#include "nxd/layers/quantize.h"

namespace nxd {

// What ColumnParallelLinear and RowParallelLinear share: the full sizes, the TP group, "weight"
// and the optional "bias" (each layer registers them with its own sharding). At TP 1 a layer runs
// on its int8 weight once one is set (layers/quantize.h).
class ParallelLinearBase : public ParallelModule, public QuantizableLinear {
 public:
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  int tp_size() const { return tp_size_; }
  Communicator& group() const { return *group_; }

 protected:
  // Resolves `group` (null: the parallel_state TP group) and checks in, out > 0, naming `type`.
  ParallelLinearBase(const char* type, int64_t in, int64_t out,
                     const std::shared_ptr<Communicator>& group);
  // What both layers tell a LoRA adapter: sizes, group, the weight's dtype and device, SP.
  LoraTarget lora_target_of(bool sequence_parallel, int64_t seq_dim) const;
  int64_t in_, out_;
  int tp_size_;
  std::shared_ptr<Communicator> group_;
  Tensor weight_, bias_;
};

struct ColumnParallelLinearOptions {
  bool bias = true;
  bool gather_output = true;  // all-gather the output's last dim (else each rank keeps its shard)
  // Fused layouts: the output rows are `stride` equal parts (e.g. [gate|up]) and each rank takes
  // its chunk of every part (NxD's partition_stride); the output keeps that per-rank order, and
  // gather_output restores the full layer's order.
  int64_t stride = 1;
  bool skip_bias_add = false;  // forward() leaves the bias out; forward_and_bias() returns it
  bool sequence_parallel_enabled = false;  // input is [.., S/tp, ..]: all-gather it first
  int64_t sequence_dimension = 1;
  ParamInit weight_init = ParamInit::fan_in_uniform();
  ParamInit bias_init = ParamInit::fan_in_uniform();
  ParamOptions param;
  std::shared_ptr<Communicator> group;  // null: the parallel_state TP group
};

// A LoRA adapter (layers/parallel/lora.h, apply_lora) adds scale * B(A(x)) to either layer's
// output, split as NxD splits it.
//
// Y = X W^T + b with W [out, in] split along out (partition_dim 0): rank r holds rows
// [r*out/tp, (r+1)*out/tp) (stride 1). The bias is sharded like the rows unless gather_output,
// where it is the full [out] bias added after the gather (duplicated over TP, as NxD).
//
// Collectives (tp > 1):
//   no SP: forward none on the input (copy_to: identity) -> local Y_r = X W_r^T [+ b_r]
//          -> if gather_output all-gather the last dim. Backward: dX_r = dY_r W_r is all-reduced
//          (SUM, f32 for bf16) over TP; dW_r = dY_r^T X.
//   SP:    forward all-gathers X along the sequence dim; only the local shard of X is saved and
//          backward re-gathers it for dW_r = dY_r^T X_full, while dX_full = dY_r W_r is
//          reduce-scattered (SUM, f32 for bf16) along the sequence dim (NxD's recipe).
//          gather_output must be false.
// Departure from NxD (which stores [out/tp, in]): stride > 1 with tp > 1 registers the weight as
// [stride, out/(stride*tp), in] (the bias as [stride, out/(stride*tp)]), so that the shard is one
// block of the full weight viewed as [stride, out/stride, in] and a single ParamInit::region can
// express it (init is by region, and a strided shard is not one block of [out, in]); forward
// views it as [out/tp, in]. Stride 1 (and tp == 1) keeps the plain [out/tp, in] layout.
class ColumnParallelLinear : public ParallelLinearBase {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features,
                       const ColumnParallelLinearOptions& opts = {});
  Tensor forward(const Tensor& x) const;
  // With skip_bias_add: {Y without bias, bias} (bias undefined when bias=false). Otherwise
  // {forward(x), undefined}.
  std::pair<Tensor, Tensor> forward_and_bias(const Tensor& x) const;
  int64_t local_out_features() const { return out_ / tp_size_; }
  int64_t stride() const { return stride_; }  // the fused parts of the output rows
  bool lora_target(LoraTarget& out) const override;

 private:
  enum class BiasAdd { add, leave_out };  // whether run() adds the bias
  Tensor run(const Tensor& x, BiasAdd bias) const;
  int64_t stride_;
  ColumnParallelLinearOptions opts_;
};

struct RowParallelLinearOptions {
  bool bias = true;
  bool input_is_parallel = false;  // input already split along its last dim (else scatter it)
  bool sequence_parallel_enabled = false;  // reduce-scatter the output along the sequence dim
  int64_t sequence_dimension = 1;
  bool skip_bias_add = false;
  // NxD's RowParallelLinear bias takes in/tp as its fan-in; nxd the full in (see below).
  ParamInit weight_init = ParamInit::fan_in_uniform();
  ParamInit bias_init = ParamInit::fan_in_uniform();
  ParamOptions param;
  std::shared_ptr<Communicator> group;
};

// Y = X W^T + b with W [out, in] split along in (partition_dim 1): rank r holds columns
// [r*in/tp, (r+1)*in/tp). The bias [out] is never sharded (initialized as the unsharded layer's:
// NxD uses in/tp as its fan-in, nxd uses the plain layer's rule).
//
// Collectives (tp > 1):
//   forward: [scatter X's last dim if !input_is_parallel] -> partial Y_r = X_r W_r^T ->
//            all-reduce SUM (no SP) or reduce-scatter along the sequence dim (SP), f32 for bf16
//            -> + b. Backward: identity (no SP) or all-gather along the sequence dim (SP);
//            [all-gather dX's last dim if the input was scattered].
//   SP requires input_is_parallel; the bias is then tagged sequence_parallel_enabled.
class RowParallelLinear : public ParallelLinearBase {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features,
                    const RowParallelLinearOptions& opts = {});
  Tensor forward(const Tensor& x) const;
  std::pair<Tensor, Tensor> forward_and_bias(const Tensor& x) const;
  int64_t local_in_features() const { return in_ / tp_size_; }
  bool lora_target(LoraTarget& out) const override;

 private:
  Tensor run(const Tensor& x) const;
  RowParallelLinearOptions opts_;
};

struct ParallelEmbeddingOptions {
  bool shard_across_embedding = false;     // split the embedding dim instead of the vocabulary
  bool sequence_parallel_enabled = false;  // the output is split along the sequence dim
  int64_t sequence_dimension = 1;
  ParamInit weight_init = ParamInit::normal(1.0);  // torch.nn.Embedding's and NxD's default
  ParamOptions param;
  std::shared_ptr<Communicator> group;
};

// The vocabulary-parallel lookup of one rank: weight [per, D] holds rows [start, start + per) of
// a [num, D] table; ids outside them give zero rows (summed over the group afterwards). An op of
// its own so the tracer records and replays it (it reads the ids on the host).
Tensor vocab_parallel_lookup(const Tensor& ids, const Tensor& weight, int64_t num, int64_t start);

// ids [...] -> [..., dim]; weight [num_embeddings, dim] sharded along the vocabulary (rank r owns
// ids [r*V/tp, (r+1)*V/tp)) or, with shard_across_embedding, along dim.
//
// Collectives (tp > 1):
//   vocab: rows of ids outside this rank's range are looked up at local row 0 and zeroed by the
//          mask, then all-reduce SUM (no SP; backward identity) or reduce-scatter along the
//          sequence dim (SP; backward all-gather). dW gets rows only for this rank's ids.
//   embedding dim: all-gather the last dim (backward: keep own chunk); with SP the result is
//          then split along the sequence dim (backward all-gather).
// An id outside [0, V) throws naming it and V, on every rank (as the plain Embedding).
// Departure from NxD: the mask is applied in the weight's dtype (NxD: bf16 unless fp32); there is
// no padding_idx and no inference-only `pad`.
class ParallelEmbedding : public ParallelModule {
 public:
  ParallelEmbedding(int64_t num_embeddings, int64_t dim, const ParallelEmbeddingOptions& opts = {});
  Tensor forward(const Tensor& ids) const;
  const Tensor& weight() const { return weight_; }
  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t dim() const { return dim_; }
  int tp_size() const { return tp_size_; }

 private:
  int64_t num_embeddings_, dim_;
  int tp_size_;
  ParallelEmbeddingOptions opts_;
  std::shared_ptr<Communicator> group_;
  Tensor weight_;
};

namespace tp_detail {
// The group a layer uses: `g`, the parallel_state TP group, or (parallel_state not initialized)
// a group of this rank alone.
std::shared_ptr<Communicator> resolve_group(const std::shared_ptr<Communicator>& g);
// `init` restricted to the block [start, start+shape) of a full tensor `full`.
ParamInit with_region(ParamInit init, const Shape& full, const Shape& start);
}  // namespace tp_detail

}  // namespace nxd

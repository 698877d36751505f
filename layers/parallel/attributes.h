#pragma once
// Parallel attributes of parameters (NxD's set_tensor_model_parallel_attributes and the
// `sequence_parallel_enabled` tag), kept on the module that owns the parameter.
//
// Every parallel layer derives from ParallelModule and tags its own parameters by their local
// name. Code that must know how a parameter is distributed (the gradient norm, the sequence-
// parallel gradient all-reduce, checkpoint sharding) calls parallel_parameters(root), which walks
// the module tree and returns every parameter of `root` (each tensor once, in registration order,
// with its hierarchical name) together with its attributes; parameters of plain modules get the
// default attributes (not sharded: identical on every TP rank).
//
// How to count a parameter once in a global gradient norm over the TP group:
//   - tensor_model_parallel && kv_replicas == 1: every rank holds a distinct shard: add every
//     rank's contribution.
//   - tensor_model_parallel && kv_replicas == m > 1 (GQA K/V replicated by kv_size_multiplier):
//     m ranks hold the same shard: add 1/m of each rank's contribution (NxD counts it m times).
//   - otherwise (norm weights, row-parallel biases, everything in plain modules): duplicated on
//     every TP rank: add 1/tp of each rank's contribution (after allreduce_sequence_parallel_
//     gradients when sequence parallelism is on, these grads are identical across TP).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/layers/module.h"

namespace nxd {

struct ParallelAttrs {
  // The tensor is one shard of a larger logical parameter split over the TP group.
  bool tensor_model_parallel = false;
  int64_t partition_dim = -1;    // dim of the logical parameter that is split
  int64_t partition_stride = 1;  // >1: the shard is `stride` interleaved blocks (fused layouts)
  int64_t num_partitions = 1;    // TP size at construction
  // Duplicated over TP but its gradient is computed from this rank's sequence shard only:
  // the gradients must be summed over TP before the optimizer step (norm weights and the
  // row-parallel bias under sequence parallelism).
  bool sequence_parallel_enabled = false;
  // GQA K/V with kv_size_multiplier m: m TP ranks (the KV-replica group) hold this same shard,
  // and their gradients are kept identical by an all-reduce over that group in backward.
  int64_t kv_replicas = 1;
};

struct LoraTarget;
class LoraAdapter;

// A Module whose own parameters may carry ParallelAttrs (keyed by their local name).
class ParallelModule : public Module {
 public:
  using Module::Module;
  // The attributes of one of this module's own parameters, or null if untagged.
  const ParallelAttrs* parallel_attrs(const std::string& local_name) const;
  // LoRA (layers/parallel/lora.h). A linear layer fills `out` with what an adapter needs and
  // returns true; other modules return false.
  virtual bool lora_target(LoraTarget& out) const;
  // The adapter this layer adds to its output (null: none); set_lora registers its children
  // lora_A and lora_B (once: InvalidArgument naming the layer type otherwise).
  const LoraAdapter* lora() const { return lora_.get(); }
  void set_lora(std::shared_ptr<LoraAdapter> adapter);

 protected:
  void set_parallel_attrs(const std::string& local_name, const ParallelAttrs& attrs);

 private:
  std::map<std::string, ParallelAttrs> attrs_;
  std::shared_ptr<LoraAdapter> lora_;
};

struct ParallelParameter {
  std::string name;  // hierarchical name, as in named_parameters()
  Tensor tensor;
  ParallelAttrs attrs;
};
// Every parameter of `root` (named_parameters() order, each tensor once) with its attributes.
std::vector<ParallelParameter> parallel_parameters(Module& root);

// NxD's allreduce_sequence_parallel_gradients: sums over `group` (default: the TP group) the
// .grad of every parameter tagged sequence_parallel_enabled, in one flat all-reduce (in f32 for
// bf16 grads). Parameters without a grad are skipped (on every rank alike: they must agree).
void allreduce_sequence_parallel_gradients(Module& root);
void allreduce_sequence_parallel_gradients(Module& root, Communicator& group);

}  // namespace nxd

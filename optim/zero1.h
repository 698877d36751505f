#pragma once
// ZeRO-1 (DeepSpeed's stage 1; NxD's NeuronZero1Optimizer): AdamW whose optimizer state is
// sharded over the data-parallel group. Each step:
//   reduce_gradients()  the parameters' gradients (each DP rank's local sum) are laid out in one
//                       flat f32 buffer, in parameter-group order, padded to a multiple of the
//                       DP size, and reduce-scattered with the mean: DP rank d keeps elements
//                       [d*S, (d+1)*S) of the averaged gradient (S = padded size / DP).
//   clip_grad_norm(c)   the global L2 norm over the shards (DP), TP and PP, each logical
//                       parameter counted once (TP-duplicated ones on TP rank 0, K/V replicas
//                       1/m, a tied copy marked shared not at all), as parallel_grad_norm; the
//                       shard is scaled by c / (norm + 1e-6) when that is < 1.
//   step()              AdamW (the same kernel as AdamW: bitwise the same update of an element
//                       from the same gradient) on this rank's shard of the parameters, with the
//                       exp_avg / exp_avg_sq of the shard only, then an all-gather of the updated
//                       shards into every parameter.
// A parameter without a gradient on every DP rank is skipped (its step count does not advance),
// as AdamW does; one with a gradient on some rank only contributes zeros elsewhere.
//
// Memory: exp_avg and exp_avg_sq of S elements per rank (1/DP of AdamW's, plus padding); the
// flat gradient and parameter buffers are transient (allocated per step). f32 parameters only.
//
// Checkpoints: state_tensors() is empty between steps. gather_state() (collective over DP)
// fills it with the full per-parameter exp_avg / exp_avg_sq / step tensors under AdamW's names,
// so a checkpoint holds AdamW's format and loads into either optimizer at any DP size;
// scatter_state() (after those tensors were overwritten by a load) takes this rank's shard back
// and release_state() frees them.
#include <cstdint>
#include <memory>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/optim/grad_norm.h"
#include "nxd/optim/optimizer.h"

namespace nxd::optim {

struct Zero1Options {
  AdamWOptions adamw;
  std::shared_ptr<Communicator> dp_group;  // null: the parallel_state DP group
  NormGroups norm_groups;                  // TP and PP groups of the norm (zero1 is dp_group)
  // The parallel attributes of the parameters, by name (parallel_parameters / norm_params of the
  // model); parameters not listed count as sharded with weight 1 in the norm.
  std::vector<NormParam> norm_params;
};

class Zero1AdamW : public Optimizer {
 public:
  Zero1AdamW(std::vector<ParamGroup> groups, Zero1Options opts);
  ~Zero1AdamW() override;

  void reduce_gradients();
  // Returns the norm before clipping; max_norm 0 = no clipping. Reduces first if needed.
  double clip_grad_norm(double max_norm);
  void step() override;

  int dp_size() const;
  int64_t shard_elements() const;  // S
  // Bytes of optimizer state this rank holds (exp_avg and exp_avg_sq of its shard).
  int64_t state_bytes() const;

  void gather_state();
  void scatter_state();
  void release_state() override;
  void materialize_state() override { gather_state(); }
  void commit_state() override { scatter_state(); }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace nxd::optim

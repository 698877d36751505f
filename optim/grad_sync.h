#pragma once
// Data-parallel gradient reduction in flat buckets whose slices ARE the parameters' .grad
// (PyTorch DDP's reducer with gradient_as_bucket_view, llm.c's flat gradient buffer; NxD's
// bucket_allreduce_gradients, and the reduce-scatter of its ZeRO-1 optimizer), over the DP group.
//
// Buckets. At construction the parameters are assigned to buckets in a fixed order: reverse
// registration order (the order in which backward finishes their gradients), a bucket being
// closed once it holds at least `bucket_bytes` bytes (a parameter larger than a bucket gets a
// bucket of its own). Parameters are bucketed by dtype, and a bucket holds the gradients in f32
// for f32 parameters, f64 for f64, and for bf16 parameters f32 with `fp32_grad_acc` (NxD's
// use_fp32_grad_acc: the gradients of bf16 parameters are accumulated and reduced in f32, and their
// .grad is f32) or bf16 without (pure bf16; the backends reduce bf16 in f32 and round once). Each
// bucket is one contiguous buffer, and every parameter's slice of it is the parameter's gradient
// buffer (autograd::set_grad_buffer): backward writes the first gradient of a pass straight into
// the slice and adds later ones in place, so the reduction runs in place with no copy in or out.
//
// Reductions.
//   all_reduce      (DDP) the bucket, followed by one "has a gradient" flag per parameter (1 if
//                   this rank had one, 0 if not), is averaged over the group in place: after
//                   finish() every .grad holds the DP mean.
//   reduce_scatter  (ZeRO-1) the bucket is padded with zeros to a multiple of the group size n
//                   and reduce-scattered with the mean in place: DP rank r's block of the bucket,
//                   elements [r*S, (r+1)*S) (S = shard_numel(b)), receives the average of that
//                   block over the group, and bucket_shard(b) is a view of it (no second buffer);
//                   the rest of .grad is undefined after finish() (this rank's own gradient on the
//                   sim backend, MPI may overwrite it). has_grad(i) says whether any rank had a
//                   gradient for parameter i (one small all-reduce of the flags in finish()).
//
// Storage (reduce_scatter only).
//   buckets     (ZeRO-1) as above: the full-size buckets live for the whole run.
//   shard_only  (ZeRO-2) no full-size buffer is kept: backward writes each parameter's .grad as a
//               fresh tensor (f32 for bf16 parameters with fp32_grad_acc,
//               autograd::set_grad_dtype); at its launch a bucket's buffer is allocated, the .grads
//               are copied in and set to none (freed), and the bucket is reduce-scattered (mean)
//               straight into this rank's persistent shard [S]; the buffer is freed once the
//               reduction completed. In overlap mode a bucket's predecessor is waited for and freed
//               when the bucket launches, so at most two buckets are in flight. Between steps a
//               rank holds only its shards (1/DP of the gradients, plus padding). The reduced
//               values are bitwise those of `buckets` (the same bucket layout and collectives, the
//               same accumulation dtype).
//
// Modes.
//   overlap: a hook on every parameter (autograd::register_hook) counts its final gradient of the
//            pass; when every gradient of a bucket has arrived the bucket's non-blocking reduction
//            is launched, so communication overlaps the rest of backward. Buckets are always
//            launched in bucket order (a bucket that fills early waits for the ones before it), so
//            every rank issues the same collectives in the same order.
//   at_step: hooks do nothing; finish() launches every bucket.
// finish() launches the buckets not launched yet, waits for all of them in bucket order and gives
// the results (above). Call it once per optimizer step, after the last backward. Anything that
// changes .grad between the last backward and finish() must commute with the reduction in overlap
// mode (a bucket may already be on its way): allreduce_sequence_parallel_gradients does (sum over
// TP and mean over DP commute), so it runs after finish() there; use at_step otherwise.
//
// Cost: the reductions run on the comm stream and overlap the compute charged after their launch;
// there are no bucket copies to charge. A .grad that is not its bucket slice when its bucket is
// launched (set by hand, or computed before the GradSync existed) is copied into the slice and
// .grad re-pointed to it (copied_bytes() counts these copies; normally 0).
//
// Missing gradients: a parameter without .grad on a rank contributes zeros. After an all_reduce
// finish() it has the average as .grad if any rank of the group had a gradient for it, and keeps
// no .grad if no rank had one (so the optimizer skips it on every replica alike, as on one rank).
//
// Gradient accumulation: hooks fire on every backward. Wrap all but the last microbatch's
// backward in set_sync(false) (or a NoSync guard) so only the last pass launches reductions; a
// parameter whose gradient becomes ready twice with sync on before finish() is an error
// (InvalidArgument naming it). finish() reduces whatever is accumulated, whatever the sync flag.
// Zero the gradients between steps with zero_grad(set_to_none = true) (the slices stay the
// parameters' gradient buffers).
//
// Determinism: the bucket layout, the launch order and the backends' fixed reduction order (sim:
// rank order) make the results bitwise identical on every rank, every run, in both modes, and
// bitwise those of averaging copies of the gradients (the reduction is elementwise). The graph must
// have the same structure on every rank (as DDP requires): hooks fire inside backward, between the
// model's own (e.g. tensor-parallel) collectives.
//
// Hooks fire on every backward pass that reaches a parameter, nxd::grad() included: run such
// passes under no_sync() too.
//
// A group of one rank with all_reduce makes everything a no-op (no buffers, no hooks) unless bf16
// gradients are accumulated in f32, which needs the buffers. The hooks stay on the parameters
// after the GradSync is destroyed but then do nothing; the destructor removes the gradient
// buffers (.grad keeps its memory). Activation checkpointing: see docs/design/optim.md (a parameter
// used both inside and outside a checkpointed segment fires its hook early; do not share such
// parameters with bucketing).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/layers/module.h"
#include "nxd/optim/optimizer.h"

namespace nxd::optim {

enum class GradSyncMode { overlap, at_step };
const char* grad_sync_mode_name(GradSyncMode m);
enum class DpReduction { all_reduce, reduce_scatter };
const char* dp_reduction_name(DpReduction r);
enum class GradStorage { buckets, shard_only };
// When a ZeRO-3 unit's buckets go out in overlap mode: when backward has produced all their
// gradients (when_complete), or when the unit's backward is done (at_release: unit_released(),
// called by the unit as it releases its parameters after its backward, at the same point of every
// rank's backward; a parameter without a gradient there, e.g. an expert no token reached,
// contributes zeros). Mixture of experts uses at_release: with when_complete such a bucket would
// go out in backward on some ranks and only at the step on others.
enum class UnitLaunch { when_complete, at_release };

struct GradSyncOptions {
  int64_t bucket_bytes = int64_t{25} << 20;  // DDP's default bucket_cap_mb = 25
  GradSyncMode mode = GradSyncMode::overlap;
  std::shared_ptr<Communicator> group;  // null: parallel_state data x context group (DP at CP 1)
  DpReduction reduction = DpReduction::all_reduce;
  bool fp32_grad_acc = false;                  // bf16 parameters: f32 gradients (see above)
  GradStorage storage = GradStorage::buckets;  // shard_only: ZeRO-2 (reduce_scatter only)
  // Per parameter (the constructor's order): its ZeRO-3 unit; a bucket never mixes units (a new
  // unit closes the open buckets). Empty: no units.
  std::vector<int> units;
  UnitLaunch unit_launch = UnitLaunch::when_complete;
  // The first index in `units` of the lookup and root units (0: none; optim/zero3_unit.h
  // UnitModules). UnitLaunch::at_release leaves them out: a lookup is released in its forward and a
  // root after the head's backward, both before the embedding's gradient exists, and their dense
  // parameters get a gradient on every rank, so their buckets go out when complete.
  int first_root_unit = 0;
};

class GradSync {
 public:
  // `params` in registration order (e.g. Module::named_parameters()); each tensor a leaf that
  // requires grad, listed once (a repeated tensor throws InvalidArgument naming both names).
  GradSync(std::vector<NamedParam> params, GradSyncOptions opts = {});
  GradSync(const Module& model, GradSyncOptions opts = {});
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Whether backward hooks launch reductions (overlap mode); default on. Propagates to the
  // GradSyncs linked with link_sync (ZeRO-1's experts' buckets follow the dense ones' no_sync()).
  void set_sync(bool on);
  void link_sync(GradSync& follower);
  bool sync() const;
  // RAII: sync off for its lifetime (DDP's no_sync()), restoring the previous flag.
  class NoSync {
   public:
    explicit NoSync(GradSync& s) : s_(s), prev_(s.sync()) { s_.set_sync(false); }
    ~NoSync() { s_.set_sync(prev_); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    GradSync& s_;
    bool prev_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // Completes the reduction of every parameter's gradient (see above).
  void finish();
  // UnitLaunch::at_release: unit `unit`'s backward is done (its index in GradSyncOptions::units);
  // its buckets are launched (in overlap mode with sync on; otherwise nothing). The callable form
  // outlives nothing: it does nothing once the GradSync is gone.
  void unit_released(int unit);
  std::function<void()> unit_release_callback(int unit) const;

  // ---- introspection ----
  int dp_size() const;
  GradSyncMode mode() const;
  DpReduction reduction() const;
  int64_t bucket_bytes() const;
  // Parameter indices (into the constructor's list) of each bucket, in bucket (launch) order.
  std::vector<std::vector<int>> bucket_layout() const;
  // Buckets launched so far in the current pass (reset by finish()).
  int launched_buckets() const;
  // Bytes of gradients copied into bucket slices since construction (see Cost above).
  int64_t copied_bytes() const;
  // Whether gradients live in buckets at all (false: a one-rank all_reduce with nothing to do).
  bool has_buckets() const;
  // Bytes of the buckets: the gradients' memory (reduce_scatter's shards are blocks of them;
  // shard_only: the shards).
  int64_t buffer_bytes() const;

  // ---- the layout, for an optimizer working on the reduced shards (ZeRO-1) ----
  const std::vector<NamedParam>& params() const;
  int num_buckets() const;
  int bucket_of(int param) const;
  int64_t offset_in_bucket(int param) const;  // elements from the bucket's start
  // Elements of this rank's shard of bucket b (reduce_scatter: ceil(numel / n); all_reduce: the
  // bucket's gradient elements).
  int64_t shard_numel(int b) const;
  DType bucket_dtype(int b) const;  // of its gradients
  // reduce_scatter, after finish(): this rank's averaged shard of bucket b, [shard_numel(b)]
  // (bucket elements [rank * S, (rank + 1) * S)).
  Tensor bucket_shard(int b) const;
  // After finish(): whether any rank of the group had a gradient for parameter i in this step.
  bool has_grad(int param) const;

  struct State;

 private:
  std::shared_ptr<State> s_;
};

}  // namespace nxd::optim

#pragma once
// Data-parallel gradient averaging in flat buckets (PyTorch DDP's reducer, NxD's
// bucket_allreduce_gradients), over the DP group.
//
// Buckets. At construction the parameters are assigned to buckets in a fixed order: reverse
// registration order (the order in which backward finishes their gradients), a bucket being
// closed once it holds at least `bucket_bytes` bytes of f32 (a parameter larger than a bucket
// gets a bucket of its own). f64 parameters go to separate f64 buckets (same order); f32 and
// bf16 gradients are reduced in f32 (bf16 is rounded once, when the average is copied back).
// Each bucket is one contiguous buffer: the gradients of its parameters, then one "has a
// gradient" flag per parameter (1 if this rank had a gradient, 0 if not), reduced with them.
//
// Modes.
//   overlap: a hook on every parameter (autograd::register_hook) copies its final gradient of the
//            pass into its bucket; when every gradient of a bucket has arrived the bucket's
//            iall_reduce(avg) is launched, so communication overlaps the rest of backward.
//            Buckets are always launched in bucket order (a bucket that fills early waits for
//            the ones before it), so every rank issues the same collectives in the same order.
//   at_step: hooks do nothing; finish() copies and reduces every bucket.
// finish() launches the buckets not launched yet (copying the current .grad of parameters whose
// hook did not fire in this pass: unused parameters, or ones used only in earlier no_sync
// microbatches), waits for all of them in bucket order and copies the averages back into .grad
// (in place, in the gradient's dtype). Call it once per optimizer step, after the last backward.
// In overlap mode a gradient is copied when its hook fires, so changes made to .grad between the
// last backward and finish() are overwritten: transformations that commute with the average go
// after finish() — in particular allreduce_sequence_parallel_gradients (NxD runs it before the
// DP all-reduce; sum over TP and mean over DP commute).
//
// Cost: the copies into and out of the buckets are charged to the rank's cost model (sim) as
// memory traffic; the all-reduces run on the comm stream and overlap the compute charged after
// their launch.
//
// Missing gradients: a parameter without .grad on a rank contributes zeros to the average. After
// finish() it has the average as .grad if any rank of the group had a gradient for it, and keeps
// no .grad if no rank had one (so the optimizer skips it on every replica alike, as on one rank).
//
// Gradient accumulation: hooks fire on every backward. Wrap all but the last microbatch's
// backward in set_sync(false) (or a NoSync guard) so only the last pass launches reductions; a
// parameter whose gradient becomes ready twice with sync on before finish() is an error
// (InvalidArgument naming it). finish() reduces whatever is accumulated, whatever the sync flag.
//
// Determinism: the bucket layout, the launch order and the backends' fixed reduction order
// (sim: rank order) make the averages bitwise identical on every rank, every run, and in both
// modes. The graph must have the same structure on every rank (as DDP requires): hooks fire
// inside backward, between the model's own (e.g. tensor-parallel) collectives.
//
// Hooks fire on every backward pass that reaches a parameter, nxd::grad() included: run such
// passes under no_sync() too.
//
// A DP group of one rank makes everything a no-op (no hooks are registered). The hooks stay on
// the parameters after the GradSync is destroyed but then do nothing. Activation checkpointing:
// see docs/DESIGN.md (a parameter used both inside and outside a checkpointed segment fires its
// hook early; do not share such parameters with bucketing).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/layers/module.h"
#include "nxd/optim/optimizer.h"

namespace nxd::optim {

enum class GradSyncMode { overlap, at_step };
const char* grad_sync_mode_name(GradSyncMode m);

struct GradSyncOptions {
  int64_t bucket_bytes = int64_t{25} << 20;  // DDP's default bucket_cap_mb = 25
  GradSyncMode mode = GradSyncMode::overlap;
  std::shared_ptr<Communicator> group;  // null: the parallel_state DP group
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

  // Whether backward hooks launch reductions (overlap mode); default on.
  void set_sync(bool on);
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

  // Completes the averaging of every parameter's gradient (see above).
  void finish();

  // ---- introspection ----
  int dp_size() const;
  GradSyncMode mode() const;
  int64_t bucket_bytes() const;
  // Parameter indices (into the constructor's list) of each bucket, in bucket (launch) order.
  std::vector<std::vector<int>> bucket_layout() const;
  // Buckets launched so far in the current pass (reset by finish()).
  int launched_buckets() const;

  struct State;

 private:
  std::shared_ptr<State> s_;
};

}  // namespace nxd::optim

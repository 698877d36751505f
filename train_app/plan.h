#pragma once
// The memory plan of an nxd-train run, made before anything is allocated: every rank of the run
// (sim::launch over the configured instance, world_size threads) builds its part of the real
// model — the parallel layers at the run's TP, its pipeline stage's chunks, in the run's
// parameter dtype — on the meta device, lays out the gradient buckets (or ZeRO-1's padded
// buckets and flat parameter buffers) exactly as the optimizer will, and runs the forward and
// backward of one microbatch of every chunk it holds on meta inputs: the allocator's counters see
// every tensor of the step (meta tensors are counted but hold no memory), the tensor-parallel
// collectives are matched shape-only, and nothing is computed. Pipeline ranks walk their own
// schedule (pipeline/schedule.h) to find the most activations they hold at once.
//
// Per rank:
//   parameters          the parameter tensors (ZeRO-1: its flat per-bucket buffers, padding
//                       included)
//   gradients           the gradient buckets, or the .grad tensors of a one-rank run without them
//   optimizer state     AdamW's moments (and f32 masters of bf16 parameters), SGD's momentum;
//                       ZeRO-1: this rank's shard of them
//   activation peak     the most the step holds above those: saved activations of the
//                       microbatches in flight, backward's transients, received activations
//   collective buffers  the optimizer step's buffers: the f32 copies of bf16 gradients (ZeRO-1:
//                       of their reduced shards) and of bf16 parameters without master weights
//                       (ZeRO-1: one bucket's shard at a time); 0 in f32 and with master weights
//                       and f32 gradients, where the reductions and updates run in the buckets.
//                       They are live after the activations are freed: a rank's total is the
//                       resident state plus the larger of the two.
// The plan of a run is what the allocator measures as the rank's peak (tests/train_app/
// plan_test.cpp: within 5% across TP / PP / DP / ZeRO-1 / precision / checkpointing).
//
// A run that does not fit — a rank's total over the NeuronCore's HBM, or (sim backend) the sum
// over its ranks over the host RAM they share — is refused by check_fits with OutOfDeviceMemory
// (nxd-train: exit 2) naming the rank, its breakdown, the capacity and what to change.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "nxd/train_app/config.h"

namespace nxd::train_app {

struct RankMemory {
  int rank = 0;
  int stage = 0;  // pipeline stage (0 without pipeline parallelism)
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;       // in HBM (0 under optimizer offload)
  int64_t host_optimizer_state = 0;  // optimizer offload: in host memory, not in total()
  int64_t activation_peak = 0;
  int64_t collective_buffers = 0;
  // The modeled step (PlanOptions::time_step): this rank's simulated time from the common start
  // of the step to its end, its kernels, and the pipeline bubble (its time inside the schedule
  // outside forwards and backwards); the rest of the step is exposed communication.
  double step_seconds = 0, compute_seconds = 0, bubble_seconds = 0;
  // Optimizer offload: the step's wait for the buckets' round trips to the host (optim/offload.h).
  double offload_seconds = 0;
  double exposed_comm_seconds() const {
    return std::max(0.0, step_seconds - compute_seconds - bubble_seconds - offload_seconds);
  }
  // The step's peak: the resident state plus the larger of the activations (forward and
  // backward) and the optimizer step's buffers (which run after the activations are freed).
  int64_t total() const {
    return parameters + gradients + optimizer_state + std::max(activation_peak, collective_buffers);
  }
};

struct MemoryPlan {
  std::string machine;         // the modeled instance (sim::MachineSpec::name)
  int64_t hbm_bytes = 0;       // per NeuronCore
  int64_t host_ram_bytes = 0;  // shared by every rank of a sim run (and a one-rank host run)
  bool host_shared = false;    // whether the ranks share the host (sim backend)
  std::vector<RankMemory> ranks;
  double seconds = 0;  // wall time of the plan
  // What the plan assumes that a run may not do (a MoE model's balanced routing), or empty.
  std::string assumption;

  const RankMemory& worst() const;  // the rank with the largest total
  int64_t host_bytes() const;       // what the host holds: every rank's total, or rank 0's
  bool fits_hbm() const { return worst().total() <= hbm_bytes; }
  bool fits_host() const { return host_ram_bytes <= 0 || host_bytes() <= host_ram_bytes; }
  bool fits() const { return fits_hbm() && fits_host(); }
  // "memory plan: ..." lines: the worst rank's breakdown against HBM, each pipeline stage's
  // worst, the host total against RAM, fits / does not fit, and the assumption if any.
  std::string report() const;
};

struct PlanOptions {
  // The host RAM the check uses; 0: the machine's (runtime/allocator.h host_ram_bytes()), or the
  // NXD_HOST_RAM_BYTES environment variable when set (tests use a small one).
  int64_t host_ram_bytes = 0;
  // After the memory is measured, every rank runs one whole training step on meta tensors (the
  // pipeline's executor and schedule, the accumulation microbatches, the DP reduction of the
  // gradient buckets, the sequence-parallel sums, ZeRO-1's all-gathers, the loss and norm
  // reductions and nxd-train's preemption agreement) on the sim clock: the period between two
  // steps' ends that nxd-train reports as its sim step (docs/design/plan.md).
  bool time_step = false;
  std::string timeline_path;  // with time_step: the step's Chrome trace
  std::string instance;       // overrides backend.instance (e.g. "32xtrn1.32xlarge")
};

// Plans cfg's run (built-in architectures: ConfigError for another model.arch). Collective over
// nothing: it launches its own sim world of cfg.dist.world_size ranks.
MemoryPlan plan_memory(const TrainConfig& cfg, const PlanOptions& opts = {});

// The least bytes of parameters the fullest rank of cfg's run holds, in closed form before anything
// is built (ModelConfig::min_parameter_count in the run's parameter dtype: the dense weights over
// TP x PP ranks, the experts over TP x PP x EP). When a model whose plan would build more than
// 32,768 decoder layers over all its ranks (too many to build on meta tensors cheaply) is over
// the NeuronCore's HBM by it,
// plan_memory refuses it unplanned (OutOfDeviceMemory), and plan_before_training also when the
// whole model is over host RAM; a smaller model is planned and refused with its breakdown.
// nxd-plan --search skips layouts over HBM by it without planning them.
double min_parameter_bytes_per_rank(const TrainConfig& cfg);

// Throws OutOfDeviceMemory naming the rank, its breakdown, the capacity and what to change when
// the plan does not fit.
void check_fits(const MemoryPlan& plan, const TrainConfig& cfg);

// nxd-train's check (train()): plans a sim run of the built-in model, prints report() to `out`
// (null: nothing) and throws as check_fits. Runs of a module of one's own, and MPI runs, are not
// planned. Returns the planned peak of the largest rank (0: not planned); with LoRA (cfg.lora:
// the plan has the adapters, and gradients and optimizer state for them alone) also the plan of
// the same run without it, printed beside it.
struct PlannedPeak {
  int64_t planned = 0, full_fine_tuning = 0;
};
PlannedPeak plan_before_training(const TrainConfig& cfg, bool custom_module, std::FILE* out);

// Model FLOPs of one token's forward and backward, the useful work MFU counts (plan_flops.cpp:
// Megatron-LM's count, without recomputation; a MoE layer's active weights). nxd-plan and
// nxd-bench-plan-sharding divide tokens/s times it by the cores' peak.
double model_flops_per_token(const TrainConfig& c);

std::string format_bytes(int64_t bytes);  // "1.25 GiB", "312.0 MiB", "4.0 KiB"

}  // namespace nxd::train_app

// Resolution of the parallel layout: distributed_strategy.* and backend.* into a
// DistributedSection, the batching it implies, and the checks of the pipeline, tensor and context
// parallel degrees against the model and the data (config_resolver.h).
#include <algorithm>
#include <string>

#include "nxd/layers/models/config.h"
#include "nxd/pipeline/schedule.h"
#include "nxd/runtime/error.h"
#include "nxd/train_app/config.h"
#include "nxd/train_app/config_resolver.h"

namespace nxd::train_app {

constexpr int kDefaultSimWorld = 8;  // simulated NeuronCores of the default run

void check_world(int64_t world_size, int64_t tp, int64_t pp, int64_t cp) {
  if (world_size % (tp * pp * cp) != 0)
    throw ConfigError(str("[config] world size ", world_size, " is not tensor_model_parallel_size ",
                          tp, " x pipeline_model_parallel_size ", pp,
                          cp > 1 ? str(" x context_parallel_size ", cp) : std::string(),
                          " x data-parallel size: ", world_size, " does not divide by ",
                          tp * pp * cp,
                          " (set backend.world_size or distributed_strategy."
                          "tensor_model_parallel_size / pipeline_model_parallel_size",
                          cp > 1 ? " / context_parallel_size" : "", ")"));
}

namespace detail {
namespace {

// distributed_strategy.zero_stage, or zero1 (stage 1); both set and different is an error.
optim::ZeroStage resolve_zero_stage(Resolver& r) {
  const bool zero1 = r.c.get_bool("distributed_strategy.zero1");
  if (r.c.is_null("distributed_strategy.zero_stage"))
    return zero1 ? optim::ZeroStage::one : optim::ZeroStage::none;
  const int64_t v = r.c.get_int("distributed_strategy.zero_stage");
  if (v < 0 || v > 3)
    r.fail("distributed_strategy.zero_stage=", v,
           " is not a ZeRO stage: 0 (none), 1 (optimizer state), 2 (and gradients) or 3 (and "
           "parameters)");
  const auto stage = optim::zero_stage_from_int(v, "distributed_strategy.zero_stage");
  if (zero1 && stage != optim::ZeroStage::one)
    r.fail("distributed_strategy.zero1=true contradicts distributed_strategy.zero_stage=", v,
           " (zero1 is stage 1; set one of them)");
  return stage;
}

// Expert parallelism and MoE against the other strategies (every impossible combination named).
void check_experts(Resolver& r, const DistributedSection& ds, const ModelConfig& m) {
  const int64_t ep = ds.expert_model_parallel_size;
  if (ep > 1 && !m.moe.enabled())
    r.fail("distributed_strategy.expert_model_parallel_size=", ep,
           " needs a mixture-of-experts model (model.moe.num_experts > 0)");
  // parallel_state folds EP over the data x context ranks (Megatron-core's expert groups); under
  // mpirun without backend.world_size the data-parallel size is known once MPI starts (run_mpi
  // resolves again with the MPI world)
  const int64_t dc = ds.data_parallel_size * ds.context_parallel_size;
  if (!ds.world_size_from_launcher && dc % ep != 0)
    r.fail("distributed_strategy.expert_model_parallel_size=", ep,
           " does not divide the data-parallel size ", ds.data_parallel_size,
           ds.context_parallel_size > 1
               ? str(" x context_parallel_size ", ds.context_parallel_size, " = ", dc)
               : std::string(),
           " (world size / (tensor x pipeline parallel size))");
  if (m.moe.enabled() && m.moe.num_experts % ep != 0)
    r.fail("model.moe.num_experts=", m.moe.num_experts,
           " is not divisible by distributed_strategy.expert_model_parallel_size=", ep);
}

// backend.collective_timeout_s and the sim fault injection keys.
void resolve_faults(Resolver& r, DistributedSection& ds) {
  const bool timeout = !r.c.is_null("backend.collective_timeout_s");
  ds.collective_timeout_s = timeout ? r.c.get_double("backend.collective_timeout_s") : 0.0;
  if (timeout && !(ds.collective_timeout_s > 0 && ds.collective_timeout_s <= 1e6))
    r.fail("backend.collective_timeout_s must be in (0, 1e6] seconds, got ",
           ds.collective_timeout_s);
  ds.fail_rank = r.c.get_int("backend.fail_rank");
  ds.fail_at_step = r.positive("backend.fail_at_step");
  ds.fail_mode = r.c.get_string("backend.fail_mode");
  if (ds.backend == "sim" && ds.fail_rank >= 0 && ds.fail_mode == "kill")
    r.fail("backend.fail_mode=kill needs backend.kind=mpi (on sim it would kill every rank)");
  // under mpirun the world is known only once MPI starts: a rank beyond it never fails
  const bool world_known = !ds.world_size_from_launcher;
  if (ds.fail_rank < -1 || (world_known && ds.fail_rank >= ds.world_size))
    r.fail("backend.fail_rank=", ds.fail_rank, " is not a rank of the world (0 to ",
           ds.world_size - 1, ", or -1 for none)");
}

}  // namespace

DistributedSection resolve_distributed(Resolver& r, const ModelConfig& m) {
  DistributedSection ds;
  ds.tensor_model_parallel_size = r.positive("distributed_strategy.tensor_model_parallel_size");
  ds.pipeline_model_parallel_size = r.positive("distributed_strategy.pipeline_model_parallel_size");
  ds.context_parallel_size = r.positive("distributed_strategy.context_parallel_size");
  ds.expert_model_parallel_size = r.positive("distributed_strategy.expert_model_parallel_size");
  ds.virtual_pipeline_model_parallel_size =
      r.positive("distributed_strategy.virtual_pipeline_model_parallel_size");
  ds.pipeline_schedule =
      pipeline::parse_schedule(r.c.get_string("distributed_strategy.pipeline_schedule"));
  ds.pipeline_partition =
      pipeline::parse_partition_balance(r.c.get_string("distributed_strategy.pipeline_partition"));
  ds.zero_stage = resolve_zero_stage(r);
  ds.optimizer_offload = r.c.get_bool("distributed_strategy.optimizer_offload");
  if (ds.optimizer_offload && !ds.zero1())
    r.fail(
        "distributed_strategy.optimizer_offload=true needs distributed_strategy.zero_stage 1, 2 "
        "or 3 (or zero1: true): only the sharded optimizer's state is offloaded");
  ds.reshard_after_forward = r.c.get_bool("distributed_strategy.reshard_after_forward");
  ds.zero3_prefetch = r.c.get_bool("distributed_strategy.zero3_prefetch")
                          ? optim::UnitPrefetch::next_unit
                          : optim::UnitPrefetch::none;
  ds.sequence_parallel = r.c.get_bool("distributed_strategy.sequence_parallel");
  ds.backend = r.c.get_string("backend.kind");
  ds.instance = r.c.get_string("backend.instance");
  ds.timeline = r.c.get_string("backend.timeline");
  if (!ds.timeline.empty() && ds.backend != "sim")
    r.fail("backend.timeline=", ds.timeline, " needs backend.kind=sim (got ", ds.backend,
           "): only the sim backend has a modeled clock to trace");
  r.derive("distributed_strategy.kv_replicator",
           std::max<int64_t>(1, ds.tensor_model_parallel_size / m.num_kv_heads));
  ds.kv_replicator = r.positive("distributed_strategy.kv_replicator");
  ds.grad_bucket_mb = r.c.get_double("distributed_strategy.grad_bucket_mb");
  if (!(ds.grad_bucket_mb > 0))
    r.fail("distributed_strategy.grad_bucket_mb must be positive, got ", ds.grad_bucket_mb);
  ds.world_size_from_launcher = r.c.is_null("backend.world_size") && ds.backend == "mpi";
  r.derive("backend.world_size", ds.backend == "mpi" ? ds.tensor_model_parallel_size *
                                                           ds.pipeline_model_parallel_size *
                                                           ds.context_parallel_size
                                                     : int64_t{kDefaultSimWorld});
  ds.world_size = r.positive("backend.world_size");
  check_world(ds.world_size, ds.tensor_model_parallel_size, ds.pipeline_model_parallel_size,
              ds.context_parallel_size);
  ds.data_parallel_size =
      ds.world_size /
      (ds.tensor_model_parallel_size * ds.pipeline_model_parallel_size * ds.context_parallel_size);
  check_experts(r, ds, m);
  resolve_faults(r, ds);
  return ds;
}

int64_t resolve_batching(Resolver& r, DataSection& d, const DistributedSection& ds) {
  r.derive("data.micro_batch_size",
           std::max<int64_t>(1, d.global_batch_size / ds.data_parallel_size));
  d.micro_batch_size = r.positive("data.micro_batch_size");
  const int64_t per_step = d.micro_batch_size * ds.data_parallel_size;
  if (d.global_batch_size % per_step != 0)
    r.fail("data.global_batch_size=", d.global_batch_size,
           " is not a multiple of data.micro_batch_size=", d.micro_batch_size,
           " x data-parallel size=", ds.data_parallel_size);
  return d.global_batch_size / per_step;
}

void check_context_parallel(Resolver& r, const TrainConfig& t) {
  const int64_t cp = t.dist.context_parallel_size, tp = t.dist.tensor_model_parallel_size;
  const int64_t s = t.data.seq_length;
  // SP pads the sequence to a multiple of TP: the MoE layers would route the padding tokens
  if (t.model.moe.enabled() && t.dist.sequence_parallel && tp > 1 && (s / cp) % tp != 0)
    r.fail("data.seq_length=", s, cp > 1 ? str(" / context_parallel_size ", cp) : std::string(),
           " is not divisible by tensor_model_parallel_size=", tp,
           " (model.moe with sequence_parallel: padding tokens would be routed)");
  // the sample after training: a prompt of any length is padded under SP, and with a capacity
  // the padding tokens could take real tokens' expert slots
  if (t.model.moe.enabled() && !t.model.moe.dropless && t.dist.sequence_parallel && tp > 1 &&
      t.generation.max_new_tokens > 0)
    r.fail("generation.max_new_tokens=", t.generation.max_new_tokens,
           " with model.moe.dropless=false and sequence_parallel at tensor_model_parallel_size=",
           tp, ": the sample's prompt is padded to a multiple of ", tp,
           " and the padding tokens would take experts' capacity (set generation.max_new_tokens=0, "
           "model.moe.dropless=true or distributed_strategy.sequence_parallel=false)");
  if (cp == 1) return;
  if (const int64_t w = model_config(t).sliding_window; w > 0)
    r.fail("distributed_strategy.context_parallel_size=", cp,
           " with the model's sliding_window=", w,
           " (model.init_from / model.model_config): ring attention has no window");
  if (t.model.moe.enabled() && !t.model.moe.dropless)
    r.fail("distributed_strategy.context_parallel_size=", cp,
           " with model.moe.dropless=false: capacity drops follow the whole sequence's token "
           "order, which no rank holds (use model.moe.dropless=true)");
  if (s % (2 * cp) != 0)
    r.fail("data.seq_length=", s,
           " is not divisible by 2 x distributed_strategy."
           "context_parallel_size=",
           2 * cp, " (each rank holds 2 of 2 x ", cp, " equal chunks)");
  else if (t.dist.sequence_parallel && tp > 1 && (s / cp) % tp != 0)
    r.fail("data.seq_length=", s, " / context_parallel_size ", cp, " = ", s / cp,
           " tokens per rank are not divisible by tensor_model_parallel_size=", tp,
           " (sequence_parallel splits them)");
}

void check_pipeline_schedule(Resolver& r, const TrainConfig& t) {
  if (t.dist.pipeline_model_parallel_size > 1 || t.dist.virtual_pipeline_model_parallel_size > 1 ||
      t.dist.pipeline_schedule != pipeline::ScheduleKind::one_f_one_b) {
    pipeline::PipelineJob job;
    job.pipeline_model_parallel_size = static_cast<int>(t.dist.pipeline_model_parallel_size);
    job.virtual_pipeline_model_parallel_size =
        static_cast<int>(t.dist.virtual_pipeline_model_parallel_size);
    job.pipeline_schedule = t.dist.pipeline_schedule;
    job.data_parallel_size = static_cast<int>(t.dist.data_parallel_size);
    job.global_batch_size = t.data.global_batch_size;
    job.micro_batch_size = t.data.micro_batch_size;
    job.num_layers = t.model.num_layers;
    try {
      pipeline::resolve_schedule(job);
    } catch (const ConfigError& e) {
      r.fail(e.what());
    }
  }
}

void check_tensor_parallel(Resolver& r, const TrainConfig& t) {
  if (t.dist.tensor_model_parallel_size > 1) {
    try {
      model_config(t).validate_parallel(static_cast<int>(t.dist.tensor_model_parallel_size));
    } catch (const UserError& e) {
      r.fail("distributed_strategy.tensor_model_parallel_size=", t.dist.tensor_model_parallel_size,
             ": ", e.what());
    }
  }
}

}  // namespace detail
}  // namespace nxd::train_app

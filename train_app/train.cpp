#include "nxd/train_app/train.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/host_memory.h"
#include "nxd/train_app/dpo_module.h"
#include "nxd/train_app/fault_injection.h"
#include "nxd/train_app/orpo_module.h"
#include "nxd/train_app/plan.h"
#include "nxd/train_app/run_report.h"
#include "nxd/trainer/log.h"
#include "nxd/trainer/preempt.h"

namespace fs = std::filesystem;

namespace nxd::train_app {

namespace {

void write_config(const TrainConfig& cfg) {
  std::error_code ec;
  fs::create_directories(cfg.out_dir, ec);
  if (ec)
    throw IoError(
        str("[train] cannot create output directory '", cfg.out_dir, "': ", ec.message()));
  std::ofstream y(fs::path(cfg.out_dir) / "config.yaml");
  y << cfg.resolved.to_yaml();
  if (!y) throw IoError(str("[train] cannot write '", cfg.out_dir, "/config.yaml'"));
}

// The run's module: the caller's, or the built-in one for the configured alignment (DPO, ORPO,
// else CausalLMModule).
std::unique_ptr<CausalLMModule> make_rank_module(const TrainConfig& cfg, const TrainData& data,
                                                 const ModuleFactory& make_module) {
  return make_module ? make_module(cfg)
         : cfg.alignment.kind == AlignmentSection::Kind::dpo
             ? std::make_unique<DpoModule>(cfg, data.train, data.val)
         : cfg.alignment.kind == AlignmentSection::Kind::orpo
             ? std::make_unique<OrpoModule>(cfg)
             : std::make_unique<CausalLMModule>(cfg);
}

// The Trainer's options on this rank: trainer_options plus the callbacks (progress, summary,
// fault injection, early stopping, checkpoints), the checkpoint to resume from and, on the logging
// rank, the loggers.
trainer::TrainerOptions rank_trainer_options(const TrainConfig& cfg, const TrainOptions& opts,
                                             const TrainData& data, bool rank0, bool talk) {
  trainer::TrainerOptions to = trainer_options(cfg);
  if (talk)
    to.callbacks.push_back(std::make_shared<trainer::ProgressBarCallback>(
        trainer::ProgressOptions{opts.out, opts.tty}));
  to.callbacks.push_back(make_run_summary(cfg, data));
  if (cfg.dist.fail_rank >= 0)  // before the checkpoint callback: the failing step is not saved
    to.callbacks.push_back(std::make_shared<FaultInjection>(FaultOptions{
        .rank = static_cast<int>(cfg.dist.fail_rank),
        .at_step = cfg.dist.fail_at_step,
        .mode = cfg.dist.fail_mode,
        .hang_seconds =
            2 * (cfg.dist.collective_timeout_s > 0 ? cfg.dist.collective_timeout_s : 300.0) + 1}));
  const auto& em = cfg.exp;
  if (em.create_early_stopping_callback)
    to.callbacks.push_back(std::make_shared<trainer::EarlyStopping>(em.early_stopping));
  if (cfg.trainer.max_steps == 0) {
    // evaluation: no checkpoint
  } else if (em.create_checkpoint_callback) {
    to.callbacks.push_back(std::make_shared<trainer::ModelCheckpoint>(em.checkpoint));
  } else if (trainer::preemption_enabled()) {  // checkpointing off: a save only when preempted
                                               // (preempt.h)
    trainer::ModelCheckpointOptions k = em.checkpoint;
    k.every_n_train_steps = 0;
    k.save_last = false;
    to.callbacks.push_back(std::make_shared<trainer::ModelCheckpoint>(k));
  }
  if (!em.resume_from_checkpoint.empty())
    to.ckpt_path = em.resume_from_checkpoint;
  else if (em.resume_if_exists && ckpt::has_checkpoint(em.checkpoint.dirpath))
    to.ckpt_path = em.checkpoint.dirpath;
  if (rank0) {
    to.loggers.push_back(std::make_shared<trainer::CSVLogger>(cfg.out_dir));
    if (em.create_tensorboard_logger) {
      to.loggers.push_back(std::make_shared<trainer::TensorBoardLogger>(cfg.out_dir));
      to.callbacks.push_back(std::make_shared<trainer::LearningRateMonitor>());
    }
    to.hparams_yaml = cfg.resolved.to_yaml();
  }
  return to;
}

// The run on this rank (the current Context: a sim rank thread, an MPI process, or the single
// rank). Every rank runs it; the logging rank alone prints and writes the files.
TrainResult train_rank(const TrainConfig& cfg, const TrainOptions& opts, bool set_threads,
                       const ModuleFactory& make_module) {
  if (set_threads) set_num_threads(static_cast<int>(cfg.trainer.num_threads));
  Context& ctx = current_context();
  ctx.rng().set_seed(cfg.seed);  // dropout masks (the same on every rank of a TP group)
  if (ctx.world_size() != cfg.dist.world_size)
    throw ConfigError(str("[train] backend.world_size=", cfg.dist.world_size, " but the ",
                          cfg.dist.backend, " world has ", ctx.world_size(), " rank(s)"));
  if (!parallel_state::model_parallel_is_initialized())  // the logging rank is needed before fit
    parallel_state::initialize_model_parallel(parallel_state::ParallelSizes{
        .tensor = static_cast<int>(cfg.dist.tensor_model_parallel_size),
        .pipeline = static_cast<int>(cfg.dist.pipeline_model_parallel_size),
        .context = static_cast<int>(cfg.dist.context_parallel_size),
        .expert = static_cast<int>(cfg.dist.expert_model_parallel_size)});
  const bool rank0 = trainer::is_logging_rank();
  const bool talk = rank0 && !opts.quiet;
  if (rank0) write_config(cfg);

  TrainData data = build_data(cfg);
  auto data_module = make_data_module(data, cfg);
  std::unique_ptr<CausalLMModule> module = make_rank_module(cfg, data, make_module);

  trainer::Trainer trainer(rank_trainer_options(cfg, opts, data, rank0, talk));
  const trainer::FitResult fr = trainer.fit(*module, *data_module);

  TrainResult res{fr};
  res.host_peak_bytes = host_memory().peak();
  if (talk) print_fit_report(cfg, data, res, opts.out);
  res.sample = run_sample(cfg, *module, data, {.print = talk, .save = rank0, .out = opts.out});
  std::fflush(opts.out);
  return res;
}

}  // namespace

api::NxDConfig nxd_config_of(const TrainConfig& cfg) {
  return nxd_config_of(trainer_options(cfg));
}

trainer::TrainerOptions trainer_options(const TrainConfig& cfg) {
  trainer::TrainerOptions to;
  to.nxd.tensor_parallel_size = static_cast<int>(cfg.dist.tensor_model_parallel_size);
  to.nxd.pipeline_parallel_size = static_cast<int>(cfg.dist.pipeline_model_parallel_size);
  to.nxd.expert_parallel_size = static_cast<int>(cfg.dist.expert_model_parallel_size);
  to.nxd.context_parallel_size = static_cast<int>(cfg.dist.context_parallel_size);
  to.nxd.pipeline_config.virtual_pipeline_size =
      static_cast<int>(cfg.dist.virtual_pipeline_model_parallel_size);
  to.nxd.pipeline_config.schedule = cfg.dist.pipeline_schedule;
  to.nxd.optimizer_config.zero_stage = cfg.dist.zero_stage;
  to.nxd.optimizer_config.optimizer_offload = cfg.dist.optimizer_offload;
  to.nxd.optimizer_config.reshard_after_forward = cfg.dist.reshard_after_forward;
  to.nxd.optimizer_config.zero3_prefetch = cfg.dist.zero3_prefetch;
  to.nxd.grad_bucket_mb = cfg.dist.grad_bucket_mb;
  to.nxd.lora_config = cfg.lora;
  to.nxd.model_init_config.seed = cfg.seed;  // the adapters' initialization
  to.nxd.precision = cfg.precision.type;
  to.nxd.mixed_precision_config = {cfg.precision.master_weights, cfg.precision.fp32_grad_acc};
  to.max_steps = cfg.trainer.max_steps;
  to.max_epochs = cfg.trainer.max_epochs;
  to.accumulate_grad_batches = cfg.grad_accum_steps;
  to.log_every_n_steps = cfg.trainer.log_every_n_steps;
  to.val_check_interval = cfg.trainer.val_check_interval;
  to.limit_val_batches = cfg.trainer.limit_val_batches;
  if (cfg.trainer.max_steps == 0) {  // evaluation: one validation over the whole split
    to.val_check_interval = 1;
    to.limit_val_batches = int64_t{1} << 40;  // capped by the split (DataModule::val_batches)
  }
  to.gradient_clip_val = cfg.trainer.gradient_clip_val;
  to.on_nonfinite = cfg.trainer.on_nonfinite;
  return to;
}

TrainResult train(const TrainConfig& cfg, const TrainOptions& opts,
                  const ModuleFactory& make_module) {
  if (!make_module && !is_builtin_arch(cfg.model.arch))
    throw ConfigError(str("[train] model.arch=", cfg.model.arch,
                          " is not built in (llama, gpt_neox): another architecture trains "
                          "through a module of its own (examples/new_model)"));
  // the trainer sets the run's matmul precision (process-wide: every sim rank alike); it is
  // restored when the run ends
  blas::MatmulPrecisionScope precision_scope(api::resolve_precision(nxd_config_of(cfg)).matmul);
  // a model that cannot fit is refused before anything is allocated (train_app/plan.h)
  const PlannedPeak planned =
      plan_before_training(cfg, static_cast<bool>(make_module), opts.quiet ? nullptr : opts.out);
  auto lora_memory = [&](const TrainResult& res) {  // LoRA's allocator peak against full FT's plan
    const int64_t full = planned.full_fine_tuning;
    if (cfg.lora && !opts.quiet && full > 0 && res.hbm_peak_bytes > 0)
      std::fprintf(opts.out,
                   "lora: allocator peak %s on the largest rank (planned %s), against %s planned "
                   "for full fine-tuning (%.1f%%)\n",
                   format_bytes(res.hbm_peak_bytes).c_str(), format_bytes(planned.planned).c_str(),
                   format_bytes(full).c_str(),
                   100.0 * static_cast<double>(res.hbm_peak_bytes) / static_cast<double>(full));
  };
  if (cfg.dist.backend == "mpi" || (cfg.dist.world_size == 1 && cfg.dist.timeline.empty())) {
    TrainResult res = train_rank(cfg, opts, /*set_threads=*/true, make_module);
    lora_memory(res);
    return res;
  }
  // sim: every rank a thread of this process (BLAS single-threaded while they run)
  sim::LaunchOptions lo;
  lo.world_size = static_cast<int>(cfg.dist.world_size);
  lo.instance = cfg.dist.instance;
  lo.seed = cfg.seed;
  lo.timeline_path = cfg.dist.timeline;
  lo.timeout_s = cfg.dist.collective_timeout_s;
  if (!lo.timeline_path.empty()) {  // fail now, not after the run
    std::ofstream probe(lo.timeline_path);
    if (!probe)
      throw IoError(str("[train] backend.timeline: cannot write ", lo.timeline_path, ": ",
                        std::strerror(errno)));
  }
  TrainResult res;
  sim::LaunchResult lr = sim::launch(lo, [&] {
    TrainResult r = train_rank(cfg, opts, /*set_threads=*/false, make_module);
    if (trainer::is_logging_rank()) res = r;
  });
  for (const auto& rr : lr.ranks) {
    res.hbm_peak_bytes = std::max(res.hbm_peak_bytes, rr.peak_bytes);
    res.rank_peak_bytes.push_back(rr.peak_bytes);
  }
  res.sim_seconds = lr.sim_seconds();
  lora_memory(res);
  return res;
}

}  // namespace nxd::train_app

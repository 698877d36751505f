#include "nxd/trainer/train.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/optim/grad_norm.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/optim/lr_schedule.h"
#include "nxd/optim/optimizer.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/sim/clock.h"
#include "nxd/trainer/log.h"

namespace fs = std::filesystem;

namespace nxd::trainer {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > (v < 0 ? 1 : 0); i -= 3) {
    s.insert(static_cast<size_t>(i), 1, ',');
  }
  return s;
}

}  // namespace

std::string summarize_skipped(const std::vector<SkippedFile>& skipped) {
  if (skipped.empty()) return "";
  std::map<std::string, std::vector<std::string>> by_kind;  // "binary" -> names
  for (const auto& s : skipped) {
    const std::string kind = s.reason.substr(0, s.reason.find(':'));
    by_kind[kind].push_back(fs::path(s.path).filename().string());
  }
  std::string out = str("skipped ", skipped.size(), " file(s):");
  bool first = true;
  for (const auto& [kind, names] : by_kind) {
    out += str(first ? " " : "; ", names.size(), " ", kind, " (");
    for (size_t i = 0; i < names.size() && i < 3; ++i) out += (i ? ", " : "") + names[i];
    if (names.size() > 3) out += ", ...";
    out += ")";
    first = false;
  }
  return out;
}

TrainData build_data(const TrainConfig& cfg) {
  const auto& d = cfg.data;
  TrainData td;
  std::shared_ptr<const Dataset> all;
  if (d.kind == "random") {
    all = std::make_shared<RandomDataset>(d.random_num_samples, d.seq_length, cfg.model.vocab_size,
                                          cfg.seed);
    td.description = str("random tokens (vocab ", cfg.model.vocab_size, "), ",
                         with_commas(d.random_num_samples), " samples");
  } else {
    auto corpus = std::make_shared<Corpus>(
        d.kind == "text"
            ? load_text_corpus(d.path)
            : load_token_file(d.path, d.token_dtype == "uint16" ? 2 : 4, cfg.model.vocab_size));
    td.skipped = corpus->skipped;
    all = std::make_shared<CorpusDataset>(corpus, d.seq_length, str("corpus '", d.path, "'"));
    td.description = str(with_commas(static_cast<int64_t>(corpus->tokens.size())),
                         d.kind == "text" ? " bytes" : " tokens", " from ", corpus->files.size(),
                         " file(s) in ", d.path);
  }
  Split sp = split_dataset(all, d.val_fraction, cfg.seed);
  td.train = sp.train;
  td.val = sp.val;
  td.description +=
      str("; ", with_commas(td.train->size()), " train / ",
          with_commas(td.val ? td.val->size() : 0), " val samples of ", d.seq_length, "+1 tokens");
  return td;
}

namespace {

// The training loop on this rank (the current Context: a sim rank thread, an MPI process, or the
// single rank). Every rank runs it; rank 0 alone prints and writes the files.
TrainResult train_rank(const TrainConfig& cfg, const TrainOptions& opts_in, bool set_threads) {
  const auto t_setup = Clock::now();
  if (set_threads) set_num_threads(static_cast<int>(cfg.trainer.num_threads));
  Context& ctx = current_context();
  ctx.rng().set_seed(cfg.seed);  // dropout masks (the same on every rank of a TP group)
  const int world = ctx.world_size();
  if (world != cfg.dist.world_size)
    throw ConfigError(str("[train] backend.world_size=", cfg.dist.world_size, " but the ",
                          cfg.dist.backend, " world has ", world, " rank(s)"));
  const int tp = static_cast<int>(cfg.dist.tensor_model_parallel_size);
  if (world > 1 && !parallel_state::model_parallel_is_initialized())
    parallel_state::initialize_model_parallel(tp);
  const int dp = parallel_state::get_data_parallel_size();
  const int dp_rank = parallel_state::get_data_parallel_rank();
  const bool rank0 = ctx.rank() == 0;
  TrainOptions opts = opts_in;
  if (!rank0) opts.quiet = true;
  auto* clock = dynamic_cast<sim::SimClock*>(ctx.cost_model());
  // the mean over DP of one or more per-rank values (every rank gets the same doubles)
  auto dp_sum = [&](std::vector<double> v) {
    if (dp > 1)
      parallel_state::get_data_parallel_group().all_reduce(
          v.data(), v.data(), static_cast<int64_t>(v.size()), DType::f64, ReduceOp::sum);
    return v;
  };

  if (rank0) {
    std::error_code ec;
    fs::create_directories(cfg.out_dir, ec);
    if (ec)
      throw IoError(
          str("[train] cannot create output directory '", cfg.out_dir, "': ", ec.message()));
    std::ofstream y(fs::path(cfg.out_dir) / "config.yaml");
    y << cfg.resolved.to_yaml();
    if (!y) throw IoError(str("[train] cannot write '", cfg.out_dir, "/config.yaml'"));
  }

  const bool tty = opts.tty.value_or(ProgressBar::stdout_is_tty());
  ProgressBar bar(cfg.trainer.max_steps, tty, opts.out);
  auto say = [&](const std::string& s) {
    if (!opts.quiet) bar.message(s);
  };

  TrainData data = build_data(cfg);
  say("data: " + data.description);
  if (!data.skipped.empty()) say("data: " + summarize_skipped(data.skipped));
  DataLoader loader(data.train, cfg.data.micro_batch_size,
                    SamplerOptions{cfg.seed, cfg.data.shuffle, dp_rank, dp});
  std::vector<Batch> val_batches;
  if (data.val && cfg.trainer.val_check_interval > 0 && cfg.trainer.limit_val_batches > 0) {
    const int64_t b = cfg.data.micro_batch_size;
    const int64_t n = std::min(cfg.trainer.limit_val_batches, (data.val->size() + b - 1) / b);
    for (int64_t i = dp_rank; i < n; i += dp) {  // validation batches split over DP
      std::vector<int64_t> idx;
      for (int64_t k = i * b; k < std::min((i + 1) * b, data.val->size()); ++k) idx.push_back(k);
      val_batches.push_back(make_batch(*data.val, idx));
    }
  }

  auto model = make_causal_lm(model_config(cfg), cfg.seed);
  model->train();
  const bool sp = model->sequence_parallel();
  optim::GradSync grad_sync(
      *model, optim::GradSyncOptions{static_cast<int64_t>(cfg.dist.grad_bucket_mb * (1 << 20))});
  std::vector<optim::NormParam> norm_params = optim::norm_params(*model);
  const optim::NormGroups norm_groups = optim::NormGroups::from_parallel_state();
  std::vector<optim::NamedParam> named;
  for (auto& [name, t] : model->named_parameters()) named.push_back({name, t});
  TrainResult res;
  res.num_parameters = model->num_parameters();
  if (tp > 1) {
    res.num_parameters = 0;  // of the whole model: shards x tp, duplicates once
    for (const auto& p : norm_params)
      res.num_parameters += p.attrs.tensor_model_parallel
                                ? p.param.numel() * tp / std::max<int64_t>(1, p.attrs.kv_replicas)
                                : p.param.numel();
  }
  say(str("model: ", cfg.model.arch, ", ", cfg.model.num_layers, " layers, hidden ",
          cfg.model.hidden_size, ", ", cfg.model.num_attention_heads, " heads (",
          cfg.model.num_kv_heads, " kv), ffn ", cfg.model.ffn_hidden_size, ", vocab ",
          cfg.model.vocab_size, ": ", with_commas(res.num_parameters), " parameters"));
  if (world > 1)
    say(str("parallel: ", world, " rank(s) on ",
            cfg.dist.backend == "sim" ? "the sim backend (" + cfg.dist.instance + ")" : "MPI",
            ": tensor parallel ", tp, sp ? " with sequence parallelism" : "", ", data parallel ",
            dp, cfg.dist.kv_replicator > 1 ? str(", kv replicator ", cfg.dist.kv_replicator) : ""));

  auto groups = optim::default_param_groups(named, cfg.optim.lr, cfg.optim.weight_decay);
  std::unique_ptr<optim::Optimizer> opt;
  if (cfg.optim.name == "sgd")
    opt = std::make_unique<optim::SGD>(
        std::move(groups), optim::SGDOptions{cfg.optim.momentum, 0.0, cfg.optim.nesterov});
  else
    opt = std::make_unique<optim::AdamW>(
        std::move(groups), optim::AdamWOptions{cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps});
  optim::LRSchedule sched({optim::schedule_kind_from_name(cfg.optim.sched_name), cfg.optim.lr,
                           cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.optim.decay_steps});
  const int64_t tokens_per_step = cfg.data.global_batch_size * cfg.data.seq_length;
  say(str("train: ", cfg.trainer.max_steps, " steps of ", cfg.data.global_batch_size, " x ",
          cfg.data.seq_length, " tokens (micro batch ", cfg.data.micro_batch_size, ", ",
          cfg.grad_accum_steps, " accumulation step(s)), ", cfg.optim.name, " lr ", cfg.optim.lr,
          " ", cfg.optim.sched_name, ", ",
          (world > 1 && cfg.dist.backend == "sim" ? str(world, " rank threads")
                                                  : str(cfg.trainer.num_threads, " thread(s)")),
          cfg.trainer.matmul_precision == "fp32"
              ? std::string()
              : str(", ", cfg.trainer.matmul_precision, " matmuls (",
                    blas::bf16_kernel_name(blas::bf16_kernel()), ")"),
          "; output in ", cfg.out_dir));

  const bool has_val = data.val && cfg.trainer.val_check_interval > 0 &&
                       cfg.trainer.limit_val_batches > 0 && data.val->size() > 0;
  auto validate = [&]() -> std::optional<double> {
    if (!has_val) return std::nullopt;
    NoGradGuard ng;
    model->eval();
    double sum = 0;
    for (const auto& b : val_batches) sum += model->loss(b.ids, b.targets).item();
    model->train();
    const auto tot = dp_sum({sum, static_cast<double>(val_batches.size())});
    return tot[0] / tot[1];
  };

  std::optional<MetricsWriter> metrics;
  if (rank0) metrics.emplace((fs::path(cfg.out_dir) / "metrics.csv").string());
  res.initial_val_loss = validate();
  if (res.initial_val_loss) say(str("step 0: val_loss ", *res.initial_val_loss));

  const auto t0 = Clock::now();
  double train_seconds = 0, interval_seconds = 0, sim_train_seconds = 0;
  int64_t interval_tokens = 0;
  const double inv_accum = 1.0 / static_cast<double>(cfg.grad_accum_steps);
  for (int64_t step = 1; step <= cfg.trainer.max_steps; ++step) {
    const auto ts = Clock::now();
    const double sim_t0 = clock ? clock->now() : 0.0;
    const double lr = sched.lr(step - 1);
    opt->set_lr(lr);
    double loss_sum = 0;
    for (int64_t a = 0; a < cfg.grad_accum_steps; ++a) {
      Batch b = loader.next();
      // only the last micro batch's backward launches the DP all-reduces
      std::optional<optim::GradSync::NoSync> no_sync;
      if (a + 1 < cfg.grad_accum_steps) no_sync.emplace(grad_sync);
      Tensor loss = model->loss(b.ids, b.targets);
      loss_sum += loss.item();
      backward(cfg.grad_accum_steps == 1 ? loss : mul(loss, inv_accum));
    }
    // the order matters: DP average, then the SP sums over TP, then the norm over TP
    grad_sync.finish();
    if (sp) allreduce_sequence_parallel_gradients(*model);
    const double gn = cfg.trainer.gradient_clip_val > 0
                          ? optim::clip_parallel_grad_norm(
                                norm_params, cfg.trainer.gradient_clip_val, norm_groups)
                          : optim::parallel_grad_norm(norm_params, norm_groups);
    opt->step();
    opt->zero_grad(/*set_to_none=*/true);
    const double sim_step = clock ? clock->now() - sim_t0 : 0.0;
    sim_train_seconds += sim_step;
    const double step_s = since(ts);
    train_seconds += step_s;
    interval_seconds += step_s;
    interval_tokens += tokens_per_step;

    const double loss = dp_sum({loss_sum * inv_accum})[0] / dp;  // the global batch's mean
    if (step == 1) res.first_loss = loss;
    res.last_loss = loss;
    const bool last = step == cfg.trainer.max_steps;
    const bool do_val =
        cfg.trainer.val_check_interval > 0 && (step % cfg.trainer.val_check_interval == 0 || last);
    MetricsRow row;
    row.step = step;
    row.loss = loss;
    row.lr = lr;
    row.grad_norm = gn;
    if (clock) row.sim_step_s = sim_step;
    if (do_val) {
      row.val_loss = validate();
      if (row.val_loss) res.final_val_loss = row.val_loss;
    }
    if (step % cfg.trainer.log_every_n_steps == 0 || last || row.val_loss) {
      row.tokens_per_s = interval_seconds > 0 ? interval_tokens / interval_seconds : 0;
      row.epoch = loader.epoch();
      row.elapsed_s = since(t0);
      if (metrics) metrics->write(row);
      if (!opts.quiet) bar.update(row);
      interval_seconds = 0;
      interval_tokens = 0;
    }
    res.steps = step;
  }
  if (!opts.quiet) bar.finish();
  res.seconds = since(t0);
  res.tokens_per_s = train_seconds > 0 ? res.steps * tokens_per_step / train_seconds : 0;
  if (!opts.quiet)
    std::fprintf(opts.out, "done: %lld steps in %s (setup %.1f s), %.0f tokens/s, loss %.4f",
                 static_cast<long long>(res.steps), format_duration(res.seconds).c_str(),
                 std::chrono::duration<double>(t0 - t_setup).count(), res.tokens_per_s,
                 res.last_loss);
  if (clock) {
    res.sim_step_seconds = sim_train_seconds / static_cast<double>(res.steps);
    res.hbm_peak_bytes = ctx.memory().peak();
    if (!opts.quiet)
      std::fprintf(
          opts.out,
          "; modeled on %s: %.2f ms/step (%.0f tokens/s), HBM peak %.1f MiB per NeuronCore",
          cfg.dist.instance.c_str(), res.sim_step_seconds * 1e3,
          tokens_per_step / res.sim_step_seconds,
          static_cast<double>(res.hbm_peak_bytes) / (1 << 20));
  }
  if (!opts.quiet && res.final_val_loss)
    std::fprintf(opts.out, ", val_loss %.4f (from %.4f)", *res.final_val_loss,
                 res.initial_val_loss.value_or(0.0));
  if (!opts.quiet) std::fprintf(opts.out, "\n");

  // the text sample
  const auto& g = cfg.generation;
  if (g.max_new_tokens > 0 && cfg.data.kind == "text") {
    std::vector<int64_t> prompt;
    for (unsigned char ch : g.prompt) prompt.push_back(ch);
    GenerateOptions go;
    go.max_new_tokens = g.max_new_tokens;
    go.temperature = g.temperature;
    go.top_k = g.top_k;
    go.seed = cfg.seed;
    std::vector<int64_t> ids = model->generate(prompt, go);
    for (int64_t id : ids) res.sample.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    if (rank0) std::ofstream(fs::path(cfg.out_dir) / "sample.txt", std::ios::binary) << res.sample;
    if (!opts.quiet)
      std::fprintf(opts.out, "sample (temperature %g, top_k %lld):\n%s\n", g.temperature,
                   static_cast<long long>(g.top_k), res.sample.c_str());
  }
  std::fflush(opts.out);
  return res;
}

}  // namespace

TrainResult train(const TrainConfig& cfg, const TrainOptions& opts) {
  const auto precision = blas::parse_matmul_precision(cfg.trainer.matmul_precision);
  if (!precision)
    throw ConfigError(str("[train] trainer.matmul_precision=", cfg.trainer.matmul_precision,
                          " is not fp32|bf16"));
  blas::MatmulPrecisionScope precision_scope(*precision);  // process-wide: every sim rank
  if (cfg.dist.backend == "mpi" || (cfg.dist.world_size == 1 && cfg.dist.timeline.empty()))
    return train_rank(cfg, opts, /*set_threads=*/true);
  // sim: every rank a thread of this process (BLAS single-threaded while they run)
  sim::LaunchOptions lo;
  lo.world_size = static_cast<int>(cfg.dist.world_size);
  lo.instance = cfg.dist.instance;
  lo.seed = cfg.seed;
  lo.timeline_path = cfg.dist.timeline;
  if (!lo.timeline_path.empty()) {  // fail now, not after the run
    std::ofstream probe(lo.timeline_path);
    if (!probe)
      throw IoError(str("[train] backend.timeline: cannot write ", lo.timeline_path, ": ",
                        std::strerror(errno)));
  }
  TrainResult res;
  sim::LaunchResult lr = sim::launch(lo, [&] {
    TrainResult r = train_rank(cfg, opts, /*set_threads=*/false);
    if (current_context().rank() == 0) res = r;
  });
  for (const auto& rr : lr.ranks) res.hbm_peak_bytes = std::max(res.hbm_peak_bytes, rr.peak_bytes);
  res.sim_seconds = lr.sim_seconds();
  return res;
}

}  // namespace nxd::trainer

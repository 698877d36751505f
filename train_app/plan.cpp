#include "nxd/train_app/plan.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>

#include "nxd/api/lora.h"
#include "nxd/api/nxd_model.h"
#include "nxd/autograd/graph.h"
#include "nxd/autograd/ops.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/pipeline/partition.h"
#include "nxd/pipeline/pipeline_model.h"
#include "nxd/runtime/allocator.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/sim/host_offload.h"
#include "nxd/train_app/plan_internal.h"
#include "nxd/train_app/train.h"

namespace nxd::train_app {

std::string format_bytes(int64_t b) {
  const double x = static_cast<double>(b);
  char buf[64];
  if (x >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f GiB", x / (1024.0 * 1024 * 1024));
  else if (x >= 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f MiB", x / (1024.0 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.1f KiB", x / 1024.0);
  return buf;
}

namespace {

using detail::MetaModel;

struct GradOn {
  bool prev = GradMode::is_enabled();
  GradOn() { GradMode::set_enabled(true); }
  ~GradOn() { GradMode::set_enabled(prev); }
};

// What one chunk's microbatch costs above the resident state: the bytes its forward leaves saved
// for backward, and the peaks of its forward and of its backward (relative to before it).
struct ChunkCost {
  int64_t saved = 0, forward_peak = 0, backward_peak = 0;
  int64_t grads_added = 0;  // what stays allocated after the backward (new .grad tensors)
};

// `timing_microbatches`: the pipeline's microbatches when the step is timed (plan_step.cpp).
MetaModel build_meta_model(const TrainConfig& cfg, const api::NxDConfig& nc, DType param_dtype,
                           int timing_microbatches) {
  MetaModel mm;
  ModelConfig mc = model_config(cfg);
  mc.device = Device::meta;
  if (nc.pipeline_parallel_size > 1) {
    pipeline::PipelineOptions o = api::pipeline_options_for(nc);
    o.num_microbatches = timing_microbatches;
    o.balance = cfg.dist.pipeline_partition;
    o.pieces.micro_batch_size = cfg.data.micro_batch_size;
    o.pieces.seq_length = cfg.data.seq_length;
    o.pieces.layer_type = cfg.model.arch == "gpt_neox" ? "GPTNeoXLayer" : "LlamaDecoderLayer";
    mm.pipe = std::make_shared<pipeline::PipelineModel>(mc, cfg.seed, o);
    mm.chunks = mm.pipe->chunks();
    mm.params = mm.pipe->local_named_parameters();
  } else {
    mm.chunks = {make_causal_lm(mc, cfg.seed, ModelPart{})};
    for (auto& [n, t] : mm.chunks[0]->named_parameters()) mm.params.push_back({n, t});
  }
  if (nc.lora_config) {  // as the Trainer: adapters, then frozen weights hold no gradient or state
    std::vector<Module*> parts;
    for (auto& c : mm.chunks) parts.push_back(c.get());
    api::apply_lora_to_parts(*nc.lora_config, parts, cfg.seed);
    mm.params.clear();
    if (mm.pipe)
      mm.params = mm.pipe->local_named_parameters();
    else
      for (auto& [n, t] : mm.chunks[0]->named_parameters()) mm.params.push_back({n, t});
    std::erase_if(mm.params, [](const optim::NamedParam& p) { return !p.param.requires_grad(); });
  }
  for (auto& c : mm.chunks) {
    if (param_dtype == DType::bf16) c->to_dtype(DType::bf16);
    c->train(true);
  }
  return mm;
}

// The hidden states a stage receives: the embedding's output for one microbatch (an
// embedding-only part built and dropped here).
Tensor hidden_like(const ModelConfig& mc0, const Tensor& ids, DType dtype) {
  ModelConfig mc = mc0;
  mc.device = Device::meta;
  auto emb = make_causal_lm(mc, 0, ModelPart{.layer_begin = 0, .layer_end = 0, .head = false});
  if (dtype == DType::bf16) emb->to_dtype(DType::bf16);
  NoGradGuard ng;
  const Tensor h = emb->embed(ids);
  return empty(h.shape(), h.dtype(), Device::meta);
}

// Forward and backward of one microbatch of chunk c on meta inputs, measured by the allocator.
ChunkCost measure_chunk(CausalLM& m, bool first, bool last, const Tensor& ids,
                        const Tensor& hidden) {
  MemoryCounter& mem = current_context().memory();
  GradOn on;
  ChunkCost c;
  const int64_t base = mem.live();
  mem.reset_peak();
  {
    Tensor in;
    if (!first) {  // the received activation, kept until backward
      in = empty(hidden.shape(), hidden.dtype(), Device::meta);
      in.set_requires_grad(true);
    }
    Tensor out = m.decoder_layers(first ? m.embed(ids) : in);
    if (last) out = m.head_loss(out, ids);
    c.saved = mem.live() - base;
    c.forward_peak = mem.peak() - base;
    mem.reset_peak();
    if (last)
      backward(out);
    else
      backward(out, empty_like(out));  // the received gradient
    c.backward_peak = std::max(c.saved, mem.peak() - base);
  }
  c.grads_added = mem.live() - base;
  return c;
}

// ZeRO-3's buckets launched during a measured backward (overlap mode): completed, so the next
// backward starts a new pass.
void finish_overlapped(std::vector<detail::ReductionGroup>& groups) {
  for (detail::ReductionGroup& g : groups)
    if (g.sync && g.sync->mode() == optim::GradSyncMode::overlap) g.sync->finish();
}

// The most this rank holds above its resident state while it runs its schedule: cost[c][0] is
// chunk c's first microbatch of the step (its backward allocates the gradients when they are not
// resident buckets: they stay until the step), cost[c][1] any later one.
int64_t schedule_peak(const std::vector<pipeline::Action>& actions,
                      const std::vector<std::array<ChunkCost, 2>>& cost) {
  int64_t live = 0, peak = 0;
  std::vector<char> done(cost.size(), 0);
  for (const pipeline::Action& a : actions) {
    const size_t ci = static_cast<size_t>(a.chunk);
    const ChunkCost& c = cost[ci][done[ci]];
    if (a.kind == pipeline::ActionKind::forward) {
      peak = std::max(peak, live + c.forward_peak);
      live += c.saved;
    } else if (a.kind == pipeline::ActionKind::backward) {
      peak = std::max(peak, live - c.saved + c.backward_peak);
      live += c.grads_added - c.saved;
      done[ci] = 1;
    }
  }
  return peak;
}

RankMemory plan_rank(const TrainConfig& cfg, const PlanOptions& opts,
                     detail::StepExtrapolation& extra) {
  const int tp = static_cast<int>(cfg.dist.tensor_model_parallel_size);
  const int pp = static_cast<int>(cfg.dist.pipeline_model_parallel_size);
  const int cp = static_cast<int>(cfg.dist.context_parallel_size);
  parallel_state::initialize_model_parallel(parallel_state::ParallelSizes{
      .tensor = tp,
      .pipeline = pp,
      .context = cp,
      .expert = static_cast<int>(cfg.dist.expert_model_parallel_size)});
  const api::NxDConfig nc = nxd_config_of(cfg);
  const api::ResolvedPrecision rp = api::resolve_precision(nc);
  MemoryCounter& mem = current_context().memory();
  RankMemory r;
  r.rank = current_context().rank();
  r.stage = parallel_state::get_pipeline_model_parallel_rank();

  int64_t before = mem.live();
  // the pipeline runs the step over at most 2 x pp microbatches (the others are alike)
  const int M = static_cast<int>(cfg.grad_accum_steps);
  MetaModel mm = build_meta_model(cfg, nc, rp.param_dtype, std::min(M, 2 * pp));
  r.parameters = mem.live() - before;

  // gradients and optimizer state, per reduction group (dense; experts at EP > 1)
  std::vector<detail::ReductionGroup> groups = detail::plan_resident_state(cfg, rp, mm, r);
  const bool buckets =
      std::all_of(groups.begin(), groups.end(),
                  [](const detail::ReductionGroup& g) { return g.sync != nullptr; });

  // activations: every chunk's first and later microbatch, then the schedule (CP: this rank's
  // seq_length / CP tokens of each sequence)
  const Tensor ids =
      zeros({cfg.data.micro_batch_size, cfg.data.seq_length / cp}, DType::i64, Device::meta);
  std::vector<pipeline::Action> actions;
  std::vector<std::array<ChunkCost, 2>> cost(mm.chunks.size());
  Tensor hidden;
  pipeline::ScheduleConfig sc;
  int pp_rank = 0;
  if (mm.pipe) {
    sc = mm.pipe->schedule();
    sc.num_microbatches = M;  // the memory walks the whole step's schedule
    pp_rank = parallel_state::get_pipeline_model_parallel_rank();
    hidden = hidden_like(model_config(cfg), ids, rp.param_dtype);
    actions = pipeline::build_schedule(sc, pp_rank);
  } else {  // the accumulation steps one after another: the first, then the later ones alike
    using pipeline::ActionKind;
    for (int k = 0; k < (cfg.grad_accum_steps > 1 ? 2 : 1); ++k)
      for (ActionKind kind : {ActionKind::forward, ActionKind::backward})
        actions.push_back({kind, k, 0});
  }
  for (detail::ReductionGroup& g : groups)  // the step starts without unbucketed gradients
    if (!g.sync)
      for (auto& p : g.params) p.param.set_grad(Tensor());
  for (size_t c = 0; c < mm.chunks.size(); ++c) {
    const int ci = static_cast<int>(c);
    const bool first = !mm.pipe || pipeline::is_first_stage(sc, pp_rank, ci);
    const bool last = !mm.pipe || pipeline::is_last_stage(sc, pp_rank, ci);
    cost[c][0] = measure_chunk(*mm.chunks[c], first, last, ids, hidden);
    finish_overlapped(groups);
    cost[c][1] = measure_chunk(*mm.chunks[c], first, last, ids, hidden);
    finish_overlapped(groups);
  }
  r.activation_peak = schedule_peak(actions, cost);
  if (!buckets) {  // the gradients the backwards allocated, counted once, as gradients
    int64_t added = 0;
    for (const auto& c : cost) added += c[0].grads_added;
    r.gradients += added;
    r.activation_peak -= added;
  }
  if (opts.time_step) extra = detail::time_meta_step(cfg, rp, mm, groups, r);
  for (const auto& p : mm.params) autograd::set_grad_buffer(p.param, Tensor());
  return r;
}

// The least parameter bytes a rank holds (ModelConfig::min_parameter_count: the dense weights
// over TP x PP ranks, the experts over TP x PP x EP), and the whole model's.
struct WeightBound {
  double per_rank = 0, whole = 0, params = 0;
  int64_t over = 1;  // TP x PP (x EP for the experts)
};
WeightBound weight_bound(const TrainConfig& cfg) {
  const ModelConfig mc = model_config(cfg);
  const double bytes =
      static_cast<double>(dtype_size(api::resolve_precision(nxd_config_of(cfg)).param_dtype));
  const double experts = mc.min_expert_parameter_count(), all = mc.min_parameter_count();
  const double mp = static_cast<double>(cfg.dist.tensor_model_parallel_size *
                                        cfg.dist.pipeline_model_parallel_size);
  const double ep = static_cast<double>(cfg.dist.expert_model_parallel_size);
  return {.per_rank = bytes * ((all - experts) / mp + experts / (mp * ep)),
          .whole = bytes * all,
          .params = all,
          .over = static_cast<int64_t>(mp)};
}

std::string bytes_of(double b) {  // format_bytes of a figure that may exceed int64_t
  return b < 9e18 ? format_bytes(static_cast<int64_t>(b)) : str(b / (1024.0 * 1024 * 1024), " GiB");
}

}  // namespace

double min_parameter_bytes_per_rank(const TrainConfig& cfg) {
  return weight_bound(cfg).per_rank;
}

namespace {

// A model whose plan builds at most this many decoder layers over all its ranks (each rank builds
// its stage's layers) is planned even when its parameters cannot fit: the plan takes seconds and
// names the rank, its breakdown and what to change. Beyond it the bound refuses the model
// unplanned (a million layers took gigabytes of host memory to build on meta tensors before the
// plan could refuse them).
constexpr int64_t kLayersPlannedAnyway = 32768;
bool cheap_to_plan(const TrainConfig& cfg) {
  const int64_t pp = std::max<int64_t>(1, cfg.dist.pipeline_model_parallel_size);
  const double built = static_cast<double>((cfg.model.num_layers + pp - 1) / pp) *
                       static_cast<double>(std::max<int64_t>(1, cfg.dist.world_size));
  return built <= static_cast<double>(kLayersPlannedAnyway);
}

// Before the plan builds anything: OutOfDeviceMemory when the parameters alone cannot fit a
// NeuronCore (and the model is too large to plan cheaply).
void check_weights_fit_hbm(const TrainConfig& cfg, const sim::MachineSpec& m) {
  const WeightBound w = weight_bound(cfg);
  if (w.per_rank <= static_cast<double>(m.core.hbm_bytes) || cheap_to_plan(cfg)) return;
  throw OutOfDeviceMemory(str(
      "[plan] the model does not fit: its parameters alone (at least ", w.params, " of them, ",
      bytes_of(w.whole), ") need at least ", bytes_of(w.per_rank),
      " per NeuronCore split over TP x PP = ", w.over,
      cfg.model.moe.enabled() ? str(" (experts over EP ", cfg.dist.expert_model_parallel_size, ")")
                              : std::string(),
      " ranks, over the ", format_bytes(m.core.hbm_bytes), " HBM of a ", m.name,
      " NeuronCore (found before planning: model.num_layers=", cfg.model.num_layers,
      ", model.hidden_size=", cfg.model.hidden_size,
      "). To fit: a smaller model, or more "
      "tensor_model_parallel_size / pipeline_model_parallel_size"));
}

int64_t host_ram(const PlanOptions& o) {
  if (o.host_ram_bytes > 0) return o.host_ram_bytes;
  if (const char* e = std::getenv("NXD_HOST_RAM_BYTES")) return std::atoll(e);
  return host_ram_bytes();
}

}  // namespace

const RankMemory& MemoryPlan::worst() const {
  NXD_INTERNAL_CHECK(!ranks.empty(), "MemoryPlan without ranks");
  return *std::max_element(ranks.begin(), ranks.end(),
                           [](const auto& a, const auto& b) { return a.total() < b.total(); });
}

int64_t MemoryPlan::host_bytes() const {
  // every tensor is host memory on the sim backend; optimizer offload's state is host memory
  if (!host_shared) return ranks.empty() ? 0 : ranks[0].total() + ranks[0].host_optimizer_state;
  int64_t s = 0;
  for (const auto& r : ranks) s += r.total() + r.host_optimizer_state;
  return s;
}

MemoryPlan plan_memory(const TrainConfig& cfg, const PlanOptions& opts) {
  if (!is_builtin_arch(cfg.model.arch))
    throw ConfigError(str("[plan] model.arch=", cfg.model.arch, " is not built in"));
  const auto t0 = std::chrono::steady_clock::now();
  sim::LaunchOptions lo;
  lo.world_size = static_cast<int>(cfg.dist.world_size);
  lo.instance = !opts.instance.empty()      ? opts.instance
                : cfg.dist.backend == "sim" ? cfg.dist.instance
                                            : std::string();
  if (opts.time_step) lo.timeline_path = opts.timeline_path;
  lo.seed = cfg.seed;
  lo.memory_capacity = 0;  // measure, do not refuse
  const sim::MachineSpec machine = sim::resolve_machine(lo);
  check_weights_fit_hbm(cfg, machine);
  if (cfg.dist.optimizer_offload) {  // refused where the host side is not published (Trn3)
    [[maybe_unused]] const sim::OffloadRates host(machine);
  }
  MemoryPlan plan;
  plan.ranks.resize(static_cast<size_t>(lo.world_size));
  // the run's matmul precision (autocast: bf16 products, charged at the bf16 peak)
  blas::MatmulPrecisionScope precision_scope(api::resolve_precision(nxd_config_of(cfg)).matmul);
  std::vector<detail::StepExtrapolation> extra(plan.ranks.size());
  const sim::LaunchResult lr = sim::launch(lo, [&] {
    const size_t rank = static_cast<size_t>(current_context().rank());
    plan.ranks[rank] = plan_rank(cfg, opts, extra[rank]);
  });
  // the microbatches not run, at the slowest rank's cost of one (plan_internal.h)
  double slowest = 0;
  for (const auto& x : extra) slowest = std::max(slowest, x.seconds);
  for (size_t i = 0; i < extra.size(); ++i) {
    plan.ranks[i].step_seconds += static_cast<double>(extra[i].count) * slowest;
    plan.ranks[i].compute_seconds += static_cast<double>(extra[i].count) * extra[i].compute;
  }
  plan.machine = lr.machine.name;
  plan.hbm_bytes = lr.machine.core.hbm_bytes;
  plan.host_ram_bytes = host_ram(opts);
  plan.host_shared = cfg.dist.backend == "sim";
  plan.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const MoeConfig& moe = cfg.model.moe;
  // tests/train_app/plan_moe_test.cpp: what a run's routing does to the plan (at EP 1 nothing: a
  // rank's experts hold its T x k rows however they are spread)
  if (moe.enabled() && cfg.dist.expert_model_parallel_size > 1)
    plan.assumption =
        moe.dropless
            ? str("the experts' tokens are planned evenly routed (", moe.top_k, " of ",
                  moe.num_experts,
                  " per token); dropless, a run's busiest expert-parallel rank holds more",
                  cfg.dist.context_parallel_size > 1
                      ? std::string(" (context parallelism needs dropless: no bound)")
                      : std::string(" (set model.moe.dropless=false with a capacity_factor for "
                                    "a bound)"))
            : str("the experts' tokens are planned evenly routed, each expert at its capacity "
                  "(capacity_factor ",
                  moe.capacity_factor, "): a bound for a run's routing");
  return plan;
}

std::string MemoryPlan::report() const {
  const RankMemory& w = worst();
  std::string s =
      str("memory plan (",
          seconds < 10 ? str(static_cast<int>(seconds * 1000), " ms")
                       : str(static_cast<int>(seconds), " s"),
          " on meta tensors): rank ", w.rank, " (stage ", w.stage,
          ") holds the most per NeuronCore: parameters ", format_bytes(w.parameters),
          ", gradients ", format_bytes(w.gradients), ", optimizer state ",
          format_bytes(w.optimizer_state), ", activation peak ", format_bytes(w.activation_peak),
          ", collective buffers ", format_bytes(w.collective_buffers), " = ",
          format_bytes(w.total()), " of ", format_bytes(hbm_bytes), " HBM (", machine, ")",
          w.host_optimizer_state > 0
              ? str("; optimizer offload: ", format_bytes(w.host_optimizer_state),
                    " of optimizer state per rank in host memory")
              : std::string());
  std::map<int, const RankMemory*> stages;
  for (const auto& r : ranks)
    if (!stages.count(r.stage) || stages[r.stage]->total() < r.total()) stages[r.stage] = &r;
  if (stages.size() > 1)
    for (const auto& [st, r] : stages)
      s += str("\nmemory plan: stage ", st, " (rank ", r->rank, "): parameters ",
               format_bytes(r->parameters), ", gradients ", format_bytes(r->gradients),
               ", optimizer state ", format_bytes(r->optimizer_state), ", activation peak ",
               format_bytes(r->activation_peak), ", collective buffers ",
               format_bytes(r->collective_buffers), " = ", format_bytes(r->total()), " (",
               r->total() <= hbm_bytes ? "fits" : "does not fit", ")");
  if (host_ram_bytes > 0)
    s += str("\nmemory plan: the host holds ", format_bytes(host_bytes()),
             host_shared ? str(" for all ", ranks.size(), " rank(s)") : std::string(), " of ",
             format_bytes(host_ram_bytes), " RAM; ", fits() ? "fits" : "does not fit");
  if (!assumption.empty()) s += "\nmemory plan: " + assumption;
  return s;
}

void check_fits(const MemoryPlan& p, const TrainConfig& cfg) {
  if (p.fits()) return;
  const RankMemory& w = p.worst();
  std::string change;
  auto add = [&](const std::string& x) { change += (change.empty() ? "" : "; ") + x; };
  const int64_t tp = cfg.dist.tensor_model_parallel_size,
                pp = cfg.dist.pipeline_model_parallel_size;
  const int64_t dp = cfg.dist.data_parallel_size;
  const int64_t resident = w.parameters + w.gradients + w.optimizer_state;
  if (resident > w.activation_peak) {
    add(str(
        "shard the model over more NeuronCores (raise distributed_strategy.tensor_model_parallel_"
        "size, now ",
        tp, ", or pipeline_model_parallel_size, now ", pp, ", with backend.world_size to match)"));
    if (cfg.model.moe.enabled() && cfg.dist.expert_model_parallel_size < cfg.model.moe.num_experts)
      add(
          str("split the experts over more ranks (distributed_strategy.expert_model_parallel_"
              "size, now ",
              cfg.dist.expert_model_parallel_size, ": each rank holds ", cfg.model.moe.num_experts,
              " / EP experts; EP divides the data-parallel size ", dp,
              cfg.dist.context_parallel_size > 1
                  ? str(" x context_parallel_size ", cfg.dist.context_parallel_size)
                  : std::string(),
              ")"));
    if (!cfg.dist.zero1() && dp > 1)
      add(str("distributed_strategy.zero1=true (optimizer state ", format_bytes(w.optimizer_state),
              " -> about ", format_bytes(w.optimizer_state / dp), " per rank)"));
    if (cfg.precision.type == "fp32" || cfg.precision.type == "autocast")
      add("precision.type=bf16SR (bf16 parameters and gradients)");
    add("or a smaller model (model.hidden_size, model.num_layers)");
  } else {
    add(str("lower data.micro_batch_size=", cfg.data.micro_batch_size,
            " or data.seq_length=", cfg.data.seq_length));
    if (cfg.model.activations_checkpoint_granularity != CheckpointGranularity::full)
      add("model.activations_checkpoint_granularity=full");
    add(
        str("split each sequence over more ranks (distributed_strategy.context_parallel_size, "
            "now ",
            cfg.dist.context_parallel_size, ", with backend.world_size to match)"));
    add("or shard the activations (tensor_model_parallel_size with sequence_parallel)");
  }
  const std::string breakdown =
      str("parameters ", format_bytes(w.parameters), ", gradients ", format_bytes(w.gradients),
          ", optimizer state ", format_bytes(w.optimizer_state), ", activation peak ",
          format_bytes(w.activation_peak), ", collective buffers ",
          format_bytes(w.collective_buffers), " = ", format_bytes(w.total()));
  if (!p.fits_hbm())
    throw OutOfDeviceMemory(str("[plan] the model does not fit: rank ", w.rank, " (stage ", w.stage,
                                ") needs ", breakdown, " per NeuronCore, over the ",
                                format_bytes(p.hbm_bytes), " HBM of a ", p.machine,
                                " NeuronCore. To fit: ", change));
  throw OutOfDeviceMemory(
      str("[plan] the run does not fit in host memory: its ", p.ranks.size(), " sim rank(s) need ",
          format_bytes(p.host_bytes()), " together (rank ", w.rank, ": ", breakdown, "), over the ",
          format_bytes(p.host_ram_bytes), " of RAM they share. To fit: ", change,
          "; or fewer ranks (backend.world_size)"));
}

PlannedPeak plan_before_training(const TrainConfig& cfg, bool custom_module, std::FILE* out) {
  if (custom_module || cfg.dist.backend != "sim" || !is_builtin_arch(cfg.model.arch)) return {};
  // the sim ranks share this host: the whole model's parameters at least once (checked unplanned
  // for a model too large to plan cheaply, as check_weights_fit_hbm)
  const WeightBound w = weight_bound(cfg);
  const int64_t ram = host_ram(PlanOptions{});
  if (ram > 0 && w.whole > static_cast<double>(ram) && !cheap_to_plan(cfg))
    throw OutOfDeviceMemory(str(
        "[plan] the run does not fit in host memory: the model's "
        "parameters alone (at least ",
        w.params, " of them) need at least ", bytes_of(w.whole), ", over the ", format_bytes(ram),
        " of RAM its sim ranks share (found before planning: "
        "model.num_layers=",
        cfg.model.num_layers, ", model.hidden_size=", cfg.model.hidden_size,
        "). To fit: a smaller model"));
  const MemoryPlan plan = plan_memory(cfg);
  if (out) std::fprintf(out, "%s\n", plan.report().c_str());
  check_fits(plan, cfg);
  PlannedPeak p{.planned = plan.worst().total()};
  if (cfg.lora) {  // the same run without LoRA, for comparison
    TrainConfig full = cfg;
    full.lora.reset();
    p.full_fine_tuning = plan_memory(full).worst().total();
    if (out)
      std::fprintf(out, "lora: planned %s on the largest rank against %s for full fine-tuning\n",
                   format_bytes(p.planned).c_str(), format_bytes(p.full_fine_tuning).c_str());
  }
  return p;
}

}  // namespace nxd::train_app

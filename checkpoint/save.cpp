// save_checkpoint: this rank's shards (plain or async), then global rank 0 completes the
// checkpoint (metadata.json, done, retention) once every rank has written its files.
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <set>
#include <thread>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/dp_shards.h"
#include "nxd/checkpoint/layout.h"
#include "nxd/checkpoint/lora_files.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/checkpoint/save_plan.h"
#include "nxd/checkpoint/unit_walk.h"
#include "nxd/collectives/communicator.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/moe/moe.h"
#include "nxd/layers/quantize.h"
#include "nxd/optim/zero1.h"
#include "nxd/runtime/host_memory.h"

namespace nxd::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;
using detail::Degrees;
using detail::SavePlan;
using detail::Shard;

namespace {

// The pending async save of this rank (kept in its Context).
struct Pending {
  std::shared_ptr<SavePlan> plan;
  // The snapshot tensors of the last async save, reused by the next one when shapes match: a
  // fresh 1 GB allocation costs its page faults on every save (3-4x a memcpy of it).
  std::vector<Tensor> pool;
  std::shared_ptr<std::exception_ptr> err;
  std::thread writer;
  ~Pending() {
    if (writer.joinable()) writer.join();
  }
};

void check_tag(const std::string& tag) {
  NXD_CHECK(!tag.empty() && tag != "." && tag != ".." && tag.find('/') == std::string::npos,
            "[save_checkpoint] tag must be a plain folder name, got '", tag, "'");
}

// The metadata of a file of DP rank `dp` (its name's: this rank's, or the EP rank whose experts
// it holds) written by this (tp, pp) rank.
std::map<std::string, std::string> shard_meta(const char* kind, const Degrees& d, int dp,
                                              const std::map<std::string, ShardSpec>& specs) {
  json par = json::object();
  for (const auto& [n, s] : specs) par[n] = to_json(s);
  return {{"nxd.kind", kind},
          {"nxd.tp_rank", std::to_string(d.tp_rank)},
          {"nxd.pp_rank", std::to_string(d.pp_rank)},
          {"nxd.dp_rank", std::to_string(dp)},
          {"nxd.parallel", par.dump()}};
}

json optimizer_json(const optim::Optimizer& o) {
  json groups = json::array();
  for (const auto& g : o.param_groups()) {
    json names = json::array();
    for (const auto& p : g.params) names.push_back(p.name);
    groups.push_back({{"name", g.name},
                      {"lr", g.lr},
                      {"weight_decay", g.weight_decay},
                      {"lr_scale", g.lr_scale},
                      {"params", names}});
  }
  json options = json::object();
  const optim::AdamWOptions* adamw = nullptr;
  if (const auto* a = dynamic_cast<const optim::AdamW*>(&o)) adamw = &a->options();
  if (const auto* z = dynamic_cast<const optim::Zero1Optimizer*>(&o))
    if (std::string(z->kind()) == "AdamW") adamw = &z->options();
  if (adamw) {
    options = {{"beta1", adamw->beta1}, {"beta2", adamw->beta2}, {"eps", adamw->eps}};
  } else if (const auto* g = dynamic_cast<const optim::SGD*>(&o)) {
    const auto& x = g->options();
    options = {{"momentum", x.momentum}, {"dampening", x.dampening}, {"nesterov", x.nesterov}};
  } else {  // Lion, a ZeRO-1 optimizer over another rule, a user's optimizer
    for (const auto& [k, v] : o.hyperparameters()) options[k] = v;
  }
  return {{"kind", o.kind()}, {"steps", o.steps()}, {"options", options}, {"groups", groups}};
}

json scheduler_json(const optim::LRSchedule& s) {
  const auto& o = s.options();
  return {{"kind", optim::schedule_kind_name(o.kind)},
          {"lr", o.lr},
          {"min_lr", o.min_lr},
          {"warmup_steps", o.warmup_steps},
          {"decay_steps", o.decay_steps}};
}

// The save's copies of tensors (an async save's snapshots, a down-cast, a ZeRO-3 unit's weights
// read while it is gathered): host memory (HostMemoryScope), as a device's checkpoint is written
// from the host, taken from the previous async save's tensors of the same shape and dtype when
// there are any (no page faults).
class SnapshotPool {
 public:
  SnapshotPool() = default;  // a sync save: tensors not in a unit are written from the model
  explicit SnapshotPool(const std::vector<Tensor>& previous) : async_(true) {
    for (const Tensor& t : previous) free_[{t.shape(), t.dtype()}].push_back(t);
  }
  // t itself (sync) or a copy (async)
  Tensor take(const Tensor& t) { return async_ ? copy(t) : t.detach(); }
  Tensor copy(const Tensor& t) {
    Tensor d = t.detach();
    auto it = free_.find({d.shape(), d.dtype()});
    if (it != free_.end() && !it->second.empty()) {
      Tensor b = it->second.back();
      it->second.pop_back();
      b.copy_(d);
      return b;
    }
    const HostMemoryScope host;
    return d.clone();
  }
  Tensor bf16(const Tensor& t) {
    const HostMemoryScope host;
    return t.detach().to(DType::bf16);
  }

 private:
  bool async_ = false;
  std::map<std::pair<Shape, DType>, std::vector<Tensor>> free_;
};

// A model tensor of a ZeRO-3 unit: its slot in a shard, filled while the unit is gathered.
struct UnitTensor {
  size_t shard = 0, slot = 0;
  Tensor source;  // the model's tensor (released between gathers)
  bool down_cast = false;
  int unit = 0;
};

// The names of the MoE experts' weights held by these chunks (layers/moe/moe.h).
std::set<std::string> expert_names(const std::vector<const Module*>& chunks) {
  std::set<std::string> out;
  for (const Module* m : chunks) {
    auto& mm = const_cast<Module&>(*m);  // named_modules() is not const; nothing is changed
    std::set<const TensorImpl*> ex;
    for (const Tensor& t : moe_expert_parameters(mm)) ex.insert(t.impl());
    for (const auto& [name, t] : mm.named_parameters())
      if (ex.count(t.impl())) out.insert(name);
  }
  return out;
}

// A sharded optimizer's (ZeRO-1) file of this rank: its part of every parameter's state as it
// holds it (checkpoint/dp_shards.h), no gathering. The dense state is sharded over DP x CP and the
// experts' over the expert-DP group; EP x expert-DP tiles DP x CP (parallel_state.h), so the files
// of the DP x CP ranks hold every part once.
Shard sharded_optim_shard(const SavePlan& p, const optim::Optimizer& opt,
                          const std::map<std::string, ShardSpec>& specs, SnapshotPool& snap) {
  const Degrees& d = p.deg;
  NXD_INTERNAL_CHECK(d.ep * d.expert_dp == d.dp, "[save_checkpoint] EP ", d.ep, " x expert-DP ",
                     d.expert_dp, " does not tile the ", d.dp, " data x context ranks");
  Shard s;
  s.file = detail::shard_file("optim", {.dp_rank = d.dp_rank,
                                        .tp_rank = d.tp_rank,
                                        .pp_rank = d.pp_rank,
                                        .compressed = p.opts.compress});
  std::map<std::string, ShardSpec> used;
  const std::vector<optim::StateShard> records = opt.sharded_state();
  std::vector<const optim::StateShard*> held;
  for (const auto& r : records) {
    int64_t numel = 1;
    for (int64_t x : r.shape) numel *= x;
    // an empty parameter's step goes with DP rank 0
    if (r.hi <= r.lo && !(numel == 0 && d.dp_rank == 0)) continue;
    held.push_back(&r);
    const auto spec = specs.find(r.param);
    for (const auto& [what, t] : r.tensors) {
      const std::string name = r.param + "." + what;
      s.tensors.emplace_back(name, snap.take(t));
      if (spec != specs.end()) used[name] = spec->second;
    }
    s.tensors.emplace_back(r.param + ".step", snap.take(from_vector<int64_t>({r.step}, {})));
  }
  s.meta = shard_meta("optimizer", d, d.dp_rank, used);
  s.meta[detail::kZero1Key] = detail::zero1_json(held);
  s.meta["nxd.optimizer"] = optimizer_json(opt).dump();
  return s;
}

// A ZeRO-3 model's file of this rank (format 3, dp_shards.h): its block of each unit's flat
// parameter buffers, per parameter, taken from the unit's persistent shard (no gather, nothing
// full-size copied); DP rank 0's also holds every tensor outside units whole ([0, numel)). Under
// expert parallelism the experts' units are sharded over the expert-DP group: the rank writes its
// expert-DP block of its EP rank's experts (named by their global index, so the files of the
// expert-DP ranks of each EP rank tile its experts, as ZeRO-1's optimizer files do), and an expert
// outside units is written whole by expert-DP rank 0 of its EP rank.
Shard zero3_model_shard(const SavePlan& p, const std::vector<const Module*>& chunks,
                        const detail::UnitWalk& walk, const std::map<std::string, ShardSpec>& specs,
                        SnapshotPool& snap) {
  const Degrees& d = p.deg;
  Shard s;
  s.file = detail::shard_file("model", {.dp_rank = d.dp_rank,
                                        .tp_rank = d.tp_rank,
                                        .pp_rank = d.pp_rank,
                                        .compressed = p.opts.compress,
                                        .files = detail::ShardFiles::zero3_blocks});
  std::map<std::string, ShardSpec> used;
  std::vector<optim::StateShard> ranges;
  const std::set<std::string> experts = d.ep > 1 ? expert_names(chunks) : std::set<std::string>{};
  for (const Module* m : chunks)
    for (const auto& [name, t] : m->state_dict()) {
      const bool down_cast =
          p.opts.down_cast_bf16 && is_floating(t.dtype()) && t.dtype() != DType::bf16;
      const bool expert = experts.count(name) != 0;
      // the group the tensor is sharded over: DP x CP, or expert-DP for an expert under EP
      const int size = expert ? d.expert_dp : d.dp, rank = expert ? d.expert_dp_rank : d.dp_rank;
      Tensor values;
      int64_t lo = 0, hi = t.numel();
      if (const auto block = walk.block_of(t)) {
        const detail::UnitWalk::Block& b = *block;
        NXD_INTERNAL_CHECK(b.size == size && b.rank == rank, "[save_checkpoint] '", name,
                           "' is sharded over a group of ", b.size, " ranks (rank ", b.rank,
                           "), the checkpoint's ", expert ? "expert-DP" : "DP x CP", " group has ",
                           size, " (rank ", rank, ")");
        lo = b.lo;
        hi = b.hi;
        values = b.values;
        // a parameter of no elements goes with the group's rank 0, as an empty ZeRO-1 range does
        if (hi <= lo && !(t.numel() == 0 && rank == 0)) continue;
      } else {
        if (rank != 0) continue;
        values = t.detach().contiguous().view({t.numel()});
      }
      if (!values.defined()) values = empty({0}, t.dtype());
      s.tensors.emplace_back(name, down_cast ? snap.bf16(values) : snap.take(values));
      ranges.push_back({name, t.shape(), lo, hi, 0, {}});
      if (const auto it = specs.find(name); it != specs.end()) used[name] = it->second;
    }
  std::vector<const optim::StateShard*> held;
  for (const auto& r : ranges) held.push_back(&r);
  s.meta = shard_meta("model", d, d.dp_rank, used);
  s.meta[detail::kZero1Key] = detail::zero1_json(held);
  return s;
}

// Whether the model is written in per-rank ZeRO-3 blocks (format 3): some rank of the world has
// units and SaveOptions::zero3_files is per_rank (with expert parallelism too: the experts' blocks
// are over expert-DP, zero3_model_shard). Collective.
bool zero3_blocks(const detail::UnitWalk& walk, const SaveOptions& o) {
  int32_t units = walk.size();
  Communicator& w = world();
  if (w.size() > 1) w.all_reduce(&units, &units, 1, DType::i32, ReduceOp::max);
  return units > 0 && o.zero3_files == Zero3ModelFiles::per_rank;
}

// This rank's files, with tensors copied (async) or shared with the live model (sync); the
// tensors of ZeRO-3 units are left empty, listed in `later` (fill_units).
void build_shards(SavePlan& p, const std::vector<const Module*>& chunks,
                  const optim::Optimizer* opt, const optim::LRSchedule* sched, const json& user,
                  const detail::UnitWalk& walk, SnapshotPool& snap,
                  std::vector<UnitTensor>& later) {
  const Degrees& d = p.deg;
  const bool z = p.opts.compress;
  std::map<std::string, ShardSpec> specs;
  specs = detail::model_specs(chunks);
  // expert parallelism: the writers of EP ranks 1..ep-1 (Degrees::expert_file: expert-DP rank 0)
  // write only the experts they hold, into the files of DP rank <EP rank> (DP rank 0 everything)
  const bool all = d.dp_rank == 0, experts_only = !all && d.expert_file() > 0;
  const int file_dp = all ? 0 : d.expert_file();
  const std::set<std::string> experts =
      experts_only ? expert_names(chunks) : std::set<std::string>{};
  auto mine = [&](const std::string& param) { return all || experts.count(param) != 0; };
  if (p.zero3 && !chunks.empty()) {
    p.shards.push_back(zero3_model_shard(p, chunks, walk, specs, snap));
  } else if (!chunks.empty() && (all || experts_only)) {
    Shard s;
    s.file = detail::shard_file(
        "model", {.dp_rank = file_dp, .tp_rank = d.tp_rank, .pp_rank = d.pp_rank, .compressed = z});
    std::map<std::string, ShardSpec> used;
    for (const Module* m : chunks)
      for (const auto& [name, t] : m->state_dict()) {
        if (!mine(name)) continue;
        const bool down_cast =
            p.opts.down_cast_bf16 && is_floating(t.dtype()) && t.dtype() != DType::bf16;
        if (specs.count(name)) used[name] = specs[name];
        if (const int u = walk.unit_of(t); u >= 0) {
          later.push_back({p.shards.size(), s.tensors.size(), t, down_cast, u});
          s.tensors.emplace_back(name, Tensor());
          continue;
        }
        s.tensors.emplace_back(name, down_cast ? snap.bf16(t) : snap.take(t));
      }
    s.meta = shard_meta("model", d, file_dp, used);
    p.shards.push_back(std::move(s));
  }
  if (opt && opt->state_is_sharded()) {
    p.shards.push_back(sharded_optim_shard(p, *opt, specs, snap));
  } else if (opt && (all || experts_only)) {
    Shard s;
    s.file = detail::shard_file(
        "optim", {.dp_rank = file_dp, .tp_rank = d.tp_rank, .pp_rank = d.pp_rank, .compressed = z});
    std::map<std::string, ShardSpec> used;
    for (const auto& [name, t] : opt->state_tensors()) {
      const auto dot = name.rfind('.');
      if (!mine(dot == std::string::npos ? name : name.substr(0, dot))) continue;
      s.tensors.emplace_back(name, snap.take(t));
      const auto it = dot == std::string::npos ? specs.end() : specs.find(name.substr(0, dot));
      if (it != specs.end() && t.dim() > 0) used[name] = it->second;
    }
    s.meta = shard_meta("optimizer", d, file_dp, used);
    s.meta["nxd.optimizer"] = optimizer_json(*opt).dump();
    p.shards.push_back(std::move(s));
  }
  if (d.rank == 0) {
    if (sched) p.texts.emplace_back(detail::kScheduler, scheduler_json(*sched).dump(2));
    p.texts.emplace_back(detail::kUserContent, user.dump(2));
  }
}

// The tensors of the ZeRO-3 units, copied to host memory one unit at a time (each gathered for
// its copies, then released): the device holds one unit's full weights beyond its shards. Every
// rank walks the units (the gathers are collective); the writers copy.
void fill_units(SavePlan& p, const detail::UnitWalk& walk, const std::vector<UnitTensor>& later,
                SnapshotPool& snap) {
  if (p.zero3) return;  // per-rank blocks: nothing to gather
  walk.for_each("[save_checkpoint]", [&](int u) {
    for (const UnitTensor& x : later)
      if (x.unit == u)
        p.shards[x.shard].tensors[x.slot].second =
            x.down_cast ? snap.bf16(x.source) : snap.copy(x.source);
  });
}

int64_t write_files(const SavePlan& p) {
  int64_t bytes = 0;
  io::SafetensorsWriteOptions w{
      .compress = p.opts.compress, .zstd_level = p.opts.zstd_level, .sync = p.opts.sync};
  for (const auto& s : p.shards)
    bytes += io::write_safetensors(p.dir / s.file, s.tensors, s.meta, w).data_bytes;
  for (const auto& [name, text] : p.texts) io::write_file_atomic(p.dir / name, text, p.opts.sync);
  return bytes;
}

}  // namespace

void finalize_checkpoint() {
  Pending& pend = current_context().ext<Pending>();
  if (!pend.plan) return;
  if (pend.writer.joinable()) pend.writer.join();
  std::shared_ptr<SavePlan> plan = std::move(pend.plan);
  std::exception_ptr err = pend.err ? *pend.err : nullptr;
  pend.plan.reset();
  pend.pool.clear();
  for (const auto& s : plan->shards)
    for (const auto& [n, t] : s.tensors) pend.pool.push_back(t);
  pend.err.reset();
  detail::run_agreed("[save_checkpoint] (background writer)", [&] {
    if (err) std::rethrow_exception(err);
  });
  detail::run_agreed("[save_checkpoint]", [&] {
    if (plan->deg.rank == 0) detail::complete(*plan);
  });
}

SaveStats save_checkpoint(const fs::path& path, const std::string& tag, const Module* model,
                          const optim::Optimizer* optimizer, const optim::LRSchedule* scheduler,
                          const json& user_content, const SaveOptions& opts) {
  std::vector<const Module*> chunks;
  if (model) chunks.push_back(model);
  return save_checkpoint(path, tag, chunks, optimizer, scheduler, user_content, opts);
}

SaveStats save_checkpoint(const fs::path& path, const std::string& tag,
                          const std::vector<const Module*>& chunks,
                          const optim::Optimizer* optimizer, const optim::LRSchedule* scheduler,
                          const json& user_content, const SaveOptions& opts) {
  using clock = std::chrono::steady_clock;
  finalize_checkpoint();
  check_tag(tag);
  // ZeRO-3: each rank's blocks of the units (zero3_model_shard), or each unit gathered in turn
  // while its weights are copied (fill_units, Zero3ModelFiles::gathered)
  const detail::UnitWalk walk(chunks);
  for (const Module* m : chunks)
    if (m) check_no_quantized_layers(*m, "save_checkpoint");
  auto plan = std::make_shared<SavePlan>();
  plan->path = path;
  plan->dir = path / tag;
  plan->tag = tag;
  plan->opts = opts;
  plan->deg = detail::current_degrees();
  plan->has_model = !chunks.empty();
  plan->has_optim = optimizer != nullptr;
  plan->zero1 = optimizer != nullptr && optimizer->state_is_sharded();
  plan->zero3 = zero3_blocks(walk, opts) && !chunks.empty();
  for (const Module* m : chunks) {
    NXD_CHECK(m != nullptr, "[save_checkpoint] a model chunk is null");
    if (const auto* lm = dynamic_cast<const CausalLM*>(m); lm && plan->model_config.is_null())
      plan->model_config = model_config_json(lm->config());
    if (const LoraConfig* lc = find_lora_config(const_cast<Module&>(*m));
        lc && plan->lora.is_null())
      plan->lora = lora_json(*lc);
  }
  plan->step = opts.step >= 0 ? opts.step : optimizer ? optimizer->steps() : 0;
  NXD_CHECK(!(optimizer && chunks.empty() && plan->deg.tp > 1),
            "[save_checkpoint] saving the optimizer at TP=", plan->deg.tp,
            " needs the model too (its parallel attributes say how the state is split)");
  std::string aside;
  detail::run_agreed("[save_checkpoint]", [&] {
    if (plan->deg.rank != 0) return;
    std::error_code ec;
    // aside folders left by a crashed re-save (no save is in flight: finalized above)
    if (fs::is_directory(path, ec))
      for (const auto& e : fs::directory_iterator(path, ec)) {
        const std::string n = e.path().filename().string();
        if (n.size() > 8 && n[0] == '.' && n.ends_with(".saving") &&
            fs::exists(e.path() / detail::kMarker))
          fs::remove_all(e.path(), ec);
      }
    if (fs::exists(plan->dir / detail::kDone)) {
      // Re-saving a complete tag: written aside and swapped in when complete (swap_in), so a
      // crash at any moment leaves a complete checkpoint under the tag.
      aside = "." + tag + ".saving";
      plan->dir = path / aside;
    } else if (fs::exists(plan->dir)) {
      // Re-saving an incomplete tag: it stops counting first, then the old files go (a save at
      // other degrees would leave shards that no longer belong to it).
      fs::remove(plan->dir / detail::kDone, ec);
      io::fsync_dir(plan->dir);
      for (const auto& e : fs::directory_iterator(plan->dir))
        if (e.path().filename() != detail::kMarker) fs::remove_all(e.path(), ec);
    }
    fs::create_directories(plan->dir / "model");
    fs::create_directories(plan->dir / "optim");
    io::fsync_dir(plan->dir);
    io::write_file_atomic(plan->dir / detail::kMarker, "nxd checkpoint\n", opts.sync);
    io::fsync_dir(path);
  });
  aside = detail::broadcast_string(aside);
  if (!aside.empty()) {
    plan->dir = path / aside;
    plan->swap = true;
  }
  SaveStats st;
  const auto t0 = clock::now();
  std::vector<UnitTensor> later;
  if (opts.async_save) {
    SnapshotPool snap(current_context().ext<Pending>().pool);
    detail::run_agreed("[save_checkpoint]", [&] {
      build_shards(*plan, chunks, optimizer, scheduler, user_content, walk, snap, later);
    });
    fill_units(*plan, walk, later, snap);
    for (const auto& s : plan->shards)
      for (const auto& [n, t] : s.tensors) st.bytes += t.nbytes();
    st.stall_seconds = std::chrono::duration<double>(clock::now() - t0).count();
    Pending& pend = current_context().ext<Pending>();
    pend.plan = plan;
    pend.err = std::make_shared<std::exception_ptr>();
    auto err = pend.err;
    pend.writer = std::thread([plan, err] {
      try {
        write_files(*plan);
      } catch (...) {
        *err = std::current_exception();
      }
    });
    return st;
  }
  SnapshotPool snap;
  detail::run_agreed("[save_checkpoint]", [&] {
    build_shards(*plan, chunks, optimizer, scheduler, user_content, walk, snap, later);
  });
  fill_units(*plan, walk, later, snap);
  detail::run_agreed("[save_checkpoint]", [&] { st.bytes = write_files(*plan); });
  detail::run_agreed("[save_checkpoint]", [&] {
    if (plan->deg.rank == 0) detail::complete(*plan);
  });
  st.stall_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return st;
}

}  // namespace nxd::ckpt

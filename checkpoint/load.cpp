// load_checkpoint: every tensor this rank needs is read from the saved shards into staging
// tensors (resharding on the way when the degrees differ), verified, and only when every rank
// succeeded copied into the model and optimizer.
#include <algorithm>
#include <map>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/integrity.h"
#include "nxd/checkpoint/layout.h"
#include "nxd/checkpoint/stager.h"
#include "nxd/checkpoint/unit_walk.h"
#include "nxd/collectives/communicator.h"
#include "nxd/runtime/host_memory.h"

namespace nxd::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;
using detail::Degrees;

namespace {

using detail::Want;

std::vector<const Module*> const_chunks(const std::vector<Module*>& chunks) {
  return {chunks.begin(), chunks.end()};
}

std::vector<Want> model_wants(const std::vector<Module*>& chunks) {
  std::vector<Want> out;
  const auto specs = detail::model_specs(const_chunks(chunks));
  for (const Module* m : chunks)
    for (const auto& [name, t] : m->state_dict()) {
      auto it = specs.find(name);
      out.push_back({name, t, Tensor(), it == specs.end() ? ShardSpec{} : it->second, t.shape()});
    }
  return out;
}

// The optimizer's state tensors, or a sharded optimizer's (ZeRO-1) parts of them: `records`
// gets its sharded_state(), and each part is a range of the whole TP-local tensor.
std::vector<Want> optim_wants(const optim::Optimizer& o, const std::vector<Module*>& chunks,
                              std::vector<optim::StateShard>& records) {
  const auto specs = detail::model_specs(const_chunks(chunks));
  std::vector<Want> out;
  auto spec_of = [&](const std::string& param) {
    const auto it = specs.find(param);
    return it == specs.end() ? ShardSpec{} : it->second;
  };
  if (o.state_is_sharded()) {
    records = o.sharded_state();
    for (const auto& r : records) {
      // every state name, also where this rank holds none of the parameter (zero-size parts)
      for (const auto& [what, t] : r.tensors)
        out.push_back({r.param + "." + what, t, Tensor(), spec_of(r.param), r.shape, r.lo, r.hi});
      out.push_back({r.param + ".step", zeros({}, DType::i64), Tensor(), ShardSpec{}, Shape{}});
    }
    return out;
  }
  for (const auto& [name, t] : o.state_tensors()) {
    const auto dot = name.rfind('.');
    const ShardSpec s =
        dot == std::string::npos || t.dim() == 0 ? ShardSpec{} : spec_of(name.substr(0, dot));
    out.push_back({name, t, Tensor(), s, t.shape()});
  }
  return out;
}

// A sharded optimizer's records with the staged values (parts the load did not stage keep theirs).
std::vector<optim::StateShard> staged_records(const std::vector<optim::StateShard>& records,
                                              const std::vector<Want>& staged) {
  std::map<std::string, Tensor> by_name;
  for (const auto& w : staged) by_name[w.name] = w.staged;
  std::vector<optim::StateShard> out;
  for (const auto& r : records) {
    optim::StateShard s{r.param, r.shape, r.lo, r.hi, -1, {}};
    if (auto it = by_name.find(r.param + ".step"); it != by_name.end())
      s.step = *it->second.data<int64_t>();
    for (const auto& [what, t] : r.tensors)
      if (auto it = by_name.find(r.param + "." + what); it != by_name.end())
        s.tensors.emplace_back(what, it->second);
    out.push_back(std::move(s));
  }
  return out;
}

// Everything a load commits, read and verified.
struct Staged {
  std::vector<Want> model, optim;
  std::vector<optim::StateShard> records;  // a sharded optimizer's (ZeRO-1)
  optim::LRScheduleOptions sched;
  json user = nullptr;
  int64_t optim_steps = 0;
  std::vector<double> group_lrs;
};

// The tag to load (the newest complete one if none is given), global rank 0's on every rank.
std::string agreed_tag(const fs::path& path, const std::string& wanted, const Degrees& d) {
  std::string tag;
  detail::run_agreed("[load_checkpoint]", [&] {
    if (d.rank != 0) return;
    if (!wanted.empty()) {
      tag = wanted;
      return;
    }
    auto t = newest_checkpoint(path);
    if (!t)
      throw CheckpointError(str("[load_checkpoint] no complete checkpoint under ", path.string()));
    tag = *t;
  });
  return detail::broadcast_string(tag);
}

void stage_optimizer(detail::Stager& st, const json& meta, const fs::path& dir,
                     const optim::Optimizer& o, const std::vector<Module*>& chunks,
                     const LoadOptions& opts, bool whole_model, Staged& s) {
  if (!meta.contains("optimizer"))
    throw CheckpointError(str("[load_checkpoint] ", dir.string(), " has no optimizer state"));
  const json& info = meta["optimizer"].at("info");
  const std::string kind = info.at("kind").get<std::string>();
  if (kind != o.kind())
    throw CheckpointError(str("[load_checkpoint] ", dir.string(), ": the optimizer state is ", kind,
                              "'s, the target optimizer is ", o.kind()));
  s.optim_steps = info.at("steps").get<int64_t>();
  for (const auto& g : info.at("groups")) s.group_lrs.push_back(g.at("lr").get<double>());
  s.optim = optim_wants(o, chunks, s.records);
  st.stage("optim", meta["optimizer"].at("tensors"), s.optim,
           {.strict = opts.strict, .check_unexpected = whole_model});
}

// ZeRO-3: the commit gathers one unit at a time into the device memory the model has now; a load
// that could not is refused here, before anything is written.
void check_unit_fits(const detail::UnitWalk& walk) {
  const MemoryCounter& mem = current_context().memory();
  const int64_t need = walk.largest_unit_bytes();
  if (mem.capacity() > 0 && mem.live() + need > mem.capacity())
    throw OutOfDeviceMemory(str("[load_checkpoint] gathering a ZeRO-3 unit needs ", need,
                                " bytes on ", mem.name(), ", which has ", mem.live(),
                                " in use of capacity ", mem.capacity()));
}

// Reads and verifies everything into staging tensors in host memory (where a device's checkpoint
// is read to); the model's ZeRO-3 units stay released.
Staged stage_all(const fs::path& dir, const std::vector<Module*>& chunks,
                 const optim::Optimizer* optimizer, bool scheduler, const LoadOptions& opts,
                 const Degrees& d) {
  const HostMemoryScope host;
  Staged s;
  const json meta = read_metadata(dir);
  // the checks verify makes of the file list and side files (integrity.h: one list)
  detail::SideFiles side = detail::check_listed_files(dir, meta, "[load_checkpoint]");
  detail::Stager st(dir, meta, d);
  // with PP, other stages hold the other names; with EP, other EP ranks the other experts
  const bool whole_model = d.pp == 1 && d.ep == 1;
  if (!chunks.empty()) {
    if (!meta.contains("model"))
      throw CheckpointError(str("[load_checkpoint] ", dir.string(), " has no model"));
    s.model = model_wants(chunks);
    st.stage("model", meta["model"], s.model,
             {.strict = opts.strict, .check_unexpected = whole_model});
    for (const Want& w : s.model)  // NaN/Inf weights: a diverged state, refused (integrity.h)
      if (w.staged.defined() && w.staged.is_contiguous())
        if (const int64_t bad =
                detail::count_nonfinite(w.staged.raw_data(), w.staged.numel(), w.staged.dtype()))
          throw CheckpointError(str("[load_checkpoint] ", dir.string(), ": model tensor '", w.name,
                                    "' holds ", bad, " NaN or infinite value(s)"));
  }
  if (optimizer) {
    NXD_CHECK(!chunks.empty() || d.tp == 1, "[load_checkpoint] loading the optimizer at TP=", d.tp,
              " needs the model too (its parallel attributes say how the state is split)");
    stage_optimizer(st, meta, dir, *optimizer, chunks, opts, whole_model, s);
  }
  if (scheduler) {
    if (!side.scheduler)
      throw CheckpointError(
          str("[load_checkpoint] ", dir.string(), " has no ", detail::kScheduler));
    s.sched = *side.scheduler;
  }
  s.user = std::move(side.user);
  return s;
}

}  // namespace

json load_checkpoint(const fs::path& path, Module* model, optim::Optimizer* optimizer,
                     optim::LRSchedule* scheduler, const LoadOptions& opts) {
  std::vector<Module*> chunks;
  if (model) chunks.push_back(model);
  return load_checkpoint(path, chunks, optimizer, scheduler, opts);
}

json load_checkpoint(const fs::path& path, const std::vector<Module*>& chunks,
                     optim::Optimizer* optimizer, optim::LRSchedule* scheduler,
                     const LoadOptions& opts) {
  for (const Module* m : chunks) NXD_CHECK(m != nullptr, "[load_checkpoint] a model chunk is null");
  finalize_checkpoint();
  // ZeRO-3: each unit gathered in turn at the commit, loaded, its shards taken back, released
  const detail::UnitWalk walk(const_chunks(chunks));
  const Degrees d = detail::current_degrees();
  const fs::path dir = path / agreed_tag(path, opts.tag, d);
  Staged s;
  detail::run_agreed("[load_checkpoint]", [&] {
    try {
      s = stage_all(dir, chunks, optimizer, scheduler != nullptr, opts, d);
      check_unit_fits(walk);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {  // a JSON field of the wrong type or missing
      throw CheckpointError(str("[load_checkpoint] ", dir.string(), ": malformed: ", e.what()));
    }
  });
  // Commit: nothing below can fail (shapes and dtypes were checked, and a unit's gather fits).
  NoGradGuard ng;
  std::vector<std::vector<Want*>> in_unit(static_cast<size_t>(walk.size()));
  for (auto& w : s.model) {
    if (const int u = walk.unit_of(w.target); u >= 0)
      in_unit[static_cast<size_t>(u)].push_back(&w);
    else
      w.target.detach().copy_(w.staged);
  }
  walk.for_each("[load_checkpoint]", [&](int u) {
    for (Want* w : in_unit[static_cast<size_t>(u)]) {
      w->target.detach().copy_(w->staged);
      w->staged = Tensor();  // its host memory freed as the load goes
    }
  });
  if (optimizer) {
    if (optimizer->state_is_sharded())
      optimizer->load_sharded_state(staged_records(s.records, s.optim));
    else
      for (auto& w : s.optim) w.target.detach().copy_(w.staged);
    optimizer->set_steps(s.optim_steps);
    auto& mine = optimizer->param_groups();
    for (size_t i = 0; i < mine.size() && i < s.group_lrs.size(); ++i) mine[i].lr = s.group_lrs[i];
  }
  if (scheduler) *scheduler = optim::LRSchedule(s.sched);
  return s.user;
}

}  // namespace nxd::ckpt

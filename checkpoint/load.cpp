// load_checkpoint: every tensor this rank needs is read from the saved shards into staging
// tensors (resharding on the way when the degrees differ), verified, and only when every rank
// succeeded copied into the model and optimizer.
#include <algorithm>
#include <map>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/layout.h"
#include "nxd/collectives/communicator.h"

namespace nxd::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;
using detail::Degrees;

namespace {

// One tensor wanted by this rank: its live target and the staging copy.
struct Want {
  std::string name;
  Tensor target;   // the live tensor (committed into at the end)
  Tensor staged;   // same shape and dtype, filled from the checkpoint
  ShardSpec spec;  // how the target is split at this rank's TP degree
};

// A read of one tensor from one shard file into `dst` (shape `local`).
struct Read {
  std::string name;
  Shape local;
  DType dtype;
  Tensor dst;
};

std::string list_some(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 8; ++i) s += (i ? ", '" : "'") + v[i] + "'";
  if (v.size() > 8) s += str(" and ", v.size() - 8, " more");
  return s;
}

class Stager {
 public:
  Stager(fs::path dir, const json& meta, const Degrees& d) : dir_(std::move(dir)), d_(d) {
    const auto& par = meta.at("parallel");
    saved_tp_ = par.at("tp").get<int>();
    compressed_ = meta.value("compressed", false);
  }

  // Fills every want.staged from the table `kind` ("model" or "optim" files) described by
  // `table` (name -> {dtype, shape, pp_rank, split}).
  void stage(const char* kind, const json& table, std::vector<Want>& wants, bool strict,
             bool check_unexpected) {
    std::vector<std::string> missing;
    std::map<std::string, std::vector<Read>> by_file;
    struct Gather {
      Want* want;
      Tensor full;
      ShardSpec saved;
      std::vector<std::pair<int64_t, Tensor>> parts;  // saved tp rank, its shard
    };
    std::vector<Gather> gathers;
    std::vector<Want*> kept;
    for (auto& w : wants) {
      if (!table.contains(w.name)) {
        missing.push_back(w.name);
        continue;
      }
      kept.push_back(&w);
      const json& e = table[w.name];
      const std::string where = str(dir_.string(), ": ", kind, " tensor '", w.name, "'");
      const Shape full = e.at("shape").get<Shape>();
      const std::string dt = e.at("dtype").get<std::string>();
      if (dt != safetensors_dtype(w.target.dtype()))
        throw CheckpointError(str("[load_checkpoint] ", where, " is ", dt,
                                  " in the checkpoint but ", safetensors_dtype(w.target.dtype()),
                                  " in the target"));
      const ShardSpec saved =
          e.contains("split") ? shard_spec_from_json(e["split"], where) : ShardSpec{};
      const Shape target_full = full_shape(w.target.shape(), w.spec);
      if (target_full != full)
        throw CheckpointError(str("[load_checkpoint] ", where, " has shape ", shape_str(full),
                                  " in the checkpoint but ", shape_str(target_full),
                                  " in the target (another model?)"));
      const int pp = e.at("pp_rank").get<int>();
      w.staged = empty(w.target.shape(), w.target.dtype());
      const bool same = saved == w.spec && (saved.split ? saved.parts == d_.tp : true);
      if (same) {
        const int tp = saved.split ? d_.tp_rank : d_.tp_rank % saved_tp_;
        by_file[file(kind, tp, pp)].push_back(
            {w.name, w.staged.shape(), w.staged.dtype(), w.staged});
        continue;
      }
      Gather g{&w, empty(full, w.target.dtype()), saved, {}};
      const Shape local = local_shape(full, saved, where);
      for (int64_t r : covering_ranks(saved)) {
        Tensor part = empty(local, w.target.dtype());
        g.parts.emplace_back(r, part);
        by_file[file(kind, static_cast<int>(r), pp)].push_back({w.name, local, part.dtype(), part});
      }
      gathers.push_back(std::move(g));
    }
    if (strict && !missing.empty())
      throw CheckpointError(
          str("[load_checkpoint] ", dir_.string(), ": ", missing.size(), " ", kind,
              " tensors of the target are not in the checkpoint: ", list_some(missing)));
    if (strict && check_unexpected && kept.size() != table.size()) {
      std::vector<std::string> extra;
      for (const auto& [name, e] : table.items())
        if (std::none_of(kept.begin(), kept.end(), [&](Want* w) { return w->name == name; }))
          extra.push_back(name);
      throw CheckpointError(
          str("[load_checkpoint] ", dir_.string(), ": ", extra.size(), " ", kind,
              " tensors of the checkpoint are not in the target: ", list_some(extra)));
    }
    for (auto& [rel, reads] : by_file) read_file_into(rel, reads);
    for (auto& g : gathers) {
      for (auto& [r, part] : g.parts) shard_view(g.full, g.saved, r).copy_(part);
      g.want->staged.copy_(shard_view(g.full, g.want->spec, d_.tp_rank));
    }
    wants.erase(std::remove_if(wants.begin(), wants.end(),
                               [](const Want& w) { return !w.staged.defined(); }),
                wants.end());
  }

 private:
  std::string file(const char* kind, int tp, int pp) const {
    return detail::shard_file(kind, 0, tp, pp, compressed_);
  }

  void read_file_into(const std::string& rel, std::vector<Read>& reads) {
    const fs::path p = dir_ / rel;
    if (!fs::exists(p)) throw CheckpointError(str("[load_checkpoint] missing shard ", p.string()));
    SafetensorsReader r(p);
    std::map<std::string, Tensor> dst;
    for (const auto& rd : reads) {
      const TensorInfo* t = r.header().find(rd.name);
      if (!t)
        throw CheckpointError(str("[load_checkpoint] ", p.string(), ": tensor '", rd.name,
                                  "' is listed in metadata.json but not in the file"));
      if (t->shape != rd.local || t->dtype != rd.dtype)
        throw CheckpointError(str("[load_checkpoint] ", p.string(), ": tensor '", rd.name, "' is ",
                                  safetensors_dtype(t->dtype), shape_str(t->shape), ", expected ",
                                  safetensors_dtype(rd.dtype), shape_str(rd.local)));
      dst[rd.name] = rd.dst;
    }
    r.read([&](const TensorInfo& t) -> void* {
      auto it = dst.find(t.name);
      return it == dst.end() || t.nbytes() == 0 ? nullptr : it->second.raw_data();
    });
  }

  fs::path dir_;
  Degrees d_;
  int saved_tp_ = 1;
  bool compressed_ = false;
};

void check_files(const fs::path& dir, const json& meta) {
  // Shards are checked by their reader (which names the tensor a truncation cuts); the JSON
  // files here.
  for (const auto& [rel, info] : meta.at("files").items()) {
    const fs::path p = dir / rel;
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    if (ec) throw CheckpointError(str("[load_checkpoint] missing file ", p.string()));
    if (rel.find(".safetensors") != std::string::npos) continue;
    const auto want = info.at("bytes").get<int64_t>();
    if (static_cast<int64_t>(size) != want)
      throw CheckpointError(str("[load_checkpoint] ", p.string(), " has ", size,
                                " bytes, metadata.json says ", want, " (truncated or replaced)"));
  }
}

std::vector<const Module*> const_chunks(const std::vector<Module*>& chunks) {
  return {chunks.begin(), chunks.end()};
}

std::vector<Want> model_wants(const std::vector<Module*>& chunks) {
  std::vector<Want> out;
  const auto specs = detail::model_specs(const_chunks(chunks));
  for (const Module* m : chunks)
    for (const auto& [name, t] : m->state_dict()) {
      auto it = specs.find(name);
      out.push_back({name, t, Tensor(), it == specs.end() ? ShardSpec{} : it->second});
    }
  return out;
}

std::vector<Want> optim_wants(const optim::Optimizer& o, const std::vector<Module*>& chunks) {
  const auto specs = detail::model_specs(const_chunks(chunks));
  std::vector<Want> out;
  for (const auto& [name, t] : o.state_tensors()) {
    const auto dot = name.rfind('.');
    const auto it = dot == std::string::npos ? specs.end() : specs.find(name.substr(0, dot));
    out.push_back({name, t, Tensor(), it != specs.end() && t.dim() > 0 ? it->second : ShardSpec{}});
  }
  return out;
}

optim::LRScheduleOptions scheduler_options(const fs::path& p) {
  try {
    const json j = json::parse(read_file(p));
    optim::LRScheduleOptions o;
    o.kind = optim::schedule_kind_from_name(j.at("kind").get<std::string>());
    o.lr = j.at("lr").get<double>();
    o.min_lr = j.at("min_lr").get<double>();
    o.warmup_steps = j.at("warmup_steps").get<int64_t>();
    o.decay_steps = j.at("decay_steps").get<int64_t>();
    return o;
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(str("[load_checkpoint] ", p.string(), ": ", e.what()));
  }
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
  const bool model = !chunks.empty();
  for (const Module* m : chunks) NXD_CHECK(m != nullptr, "[load_checkpoint] a model chunk is null");
  finalize_checkpoint();
  const Degrees d = detail::current_degrees();
  std::string tag;
  detail::run_agreed("[load_checkpoint]", [&] {
    if (d.rank != 0) return;
    if (!opts.tag.empty()) {
      tag = opts.tag;
    } else {
      auto t = newest_checkpoint(path);
      if (!t)
        throw CheckpointError(
            str("[load_checkpoint] no complete checkpoint under ", path.string()));
      tag = *t;
    }
  });
  tag = detail::broadcast_string(tag);
  const fs::path dir = path / tag;
  // a sharded optimizer (ZeRO-1) lays out its full state to load into (collective)
  if (optimizer) optimizer->materialize_state();
  struct Release {
    optim::Optimizer* o;
    ~Release() {
      if (o) o->release_state();
    }
  } release{optimizer};
  std::vector<Want> mw, ow;
  optim::LRScheduleOptions sched_opts;
  json user = nullptr;
  int64_t optim_steps = 0;
  std::vector<double> group_lrs;
  auto stage_all = [&] {
    const json meta = read_metadata(dir);
    check_files(dir, meta);
    Stager st(dir, meta, d);
    const bool whole_model = d.pp == 1;  // with PP, other stages hold the other names
    if (model) {
      if (!meta.contains("model"))
        throw CheckpointError(str("[load_checkpoint] ", dir.string(), " has no model"));
      mw = model_wants(chunks);
      st.stage("model", meta["model"], mw, opts.strict, whole_model);
    }
    if (optimizer) {
      if (!meta.contains("optimizer"))
        throw CheckpointError(str("[load_checkpoint] ", dir.string(), " has no optimizer state"));
      NXD_CHECK(model || d.tp == 1, "[load_checkpoint] loading the optimizer at TP=", d.tp,
                " needs the model too (its parallel attributes say how the state is split)");
      const json& optim_info = meta["optimizer"].at("info");
      const std::string kind = optim_info.at("kind").get<std::string>();
      if (kind != optimizer->kind())
        throw CheckpointError(str("[load_checkpoint] ", dir.string(), ": the optimizer state is ",
                                  kind, "'s, the target optimizer is ", optimizer->kind()));
      optim_steps = optim_info.at("steps").get<int64_t>();
      for (const auto& g : optim_info.at("groups")) group_lrs.push_back(g.at("lr").get<double>());
      ow = optim_wants(*optimizer, chunks);
      st.stage("optim", meta["optimizer"].at("tensors"), ow, opts.strict, whole_model);
    }
    if (scheduler) sched_opts = scheduler_options(dir / detail::kScheduler);
    if (fs::exists(dir / detail::kUserContent)) {
      try {
        user = json::parse(read_file(dir / detail::kUserContent));
      } catch (const std::exception& e) {
        throw CheckpointError(
            str("[load_checkpoint] ", (dir / detail::kUserContent).string(), ": ", e.what()));
      }
    }
    if (scheduler) optim::LRSchedule check(sched_opts);  // validates before the commit
  };
  detail::run_agreed("[load_checkpoint]", [&] {
    try {
      stage_all();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {  // a JSON field of the wrong type or missing
      throw CheckpointError(str("[load_checkpoint] ", dir.string(), ": malformed: ", e.what()));
    }
  });
  // Commit: nothing below can fail (shapes and dtypes were checked).
  NoGradGuard ng;
  for (auto& w : mw) w.target.detach().copy_(w.staged);
  if (optimizer) {
    for (auto& w : ow) w.target.detach().copy_(w.staged);
    optimizer->set_steps(optim_steps);
    optimizer->commit_state();
    auto& mine = optimizer->param_groups();
    for (size_t i = 0; i < mine.size() && i < group_lrs.size(); ++i) mine[i].lr = group_lrs[i];
  }
  if (scheduler) *scheduler = optim::LRSchedule(sched_opts);
  return user;
}

}  // namespace nxd::ckpt

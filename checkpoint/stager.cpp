#include "nxd/checkpoint/stager.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/integrity.h"

namespace nxd::ckpt::detail {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string list_some(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 8; ++i) s += (i ? ", '" : "'") + v[i] + "'";
  if (v.size() > 8) s += str(" and ", v.size() - 8, " more");
  return s;
}

// The floating dtype a table names ("F32", "BF16", "F64"), or nullopt.
std::optional<DType> floating_dtype_named(const std::string& name) {
  for (DType t : {DType::f32, DType::bf16, DType::f64})
    if (name == io::safetensors_dtype(t)) return t;
  return std::nullopt;
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace

Stager::Stager(fs::path dir, const json& meta, const Degrees& d) : dir_(std::move(dir)), d_(d) {
  const SavedLayout saved = saved_layout(meta);
  saved_tp_ = saved.tp;
  saved_dp_ = saved.dp;
  zero1_ = saved.zero1;
  zero3_ = saved.zero3;
  compressed_ = saved.compressed;
}

void Stager::plan(const char* kind, const json& e, Want& w) {
  const std::string where = str(dir_.string(), ": ", kind, " tensor '", w.name, "'");
  DType dtype = w.target.dtype();
  const Shape full = e.at("shape").get<Shape>();
  const std::string dt = e.at("dtype").get<std::string>();
  // a model tensor saved in another floating dtype (a down-cast bf16 save, SaveOptions) is read
  // as saved and converted once staged (stage())
  const DType saved_dtype = floating_dtype_named(dt).value_or(dtype);
  const bool convert =
      std::string(kind) == "model" && is_floating(dtype) && floating_dtype_named(dt).has_value();
  if (dt != io::safetensors_dtype(dtype) && !convert)
    throw CheckpointError(str("[load_checkpoint] ", where, " is ", dt, " in the checkpoint but ",
                              io::safetensors_dtype(dtype), " in the target"));
  if (convert) dtype = saved_dtype;
  const ShardSpec saved =
      e.contains("split") ? shard_spec_from_json(e["split"], where) : ShardSpec{};
  const int pp = e.at("pp_rank").get<int>();
  const int dp = e.value("dp_rank", 0);  // expert parallelism: the file of the experts' EP rank
  try {
    const Shape target_full = full_shape(w.local, w.spec);
    if (target_full != full)
      throw CheckpointError(str("[load_checkpoint] ", where, " has shape ", shape_str(full),
                                " in the checkpoint but ", shape_str(target_full),
                                " in the target (another model?)"));
    w.staged = empty(w.target.shape(), dtype);  // the saved dtype
    const int64_t lo = w.ranged() ? w.lo : 0, hi = w.ranged() ? w.hi : numel_of(w.local);
    char* dst = static_cast<char*>(w.staged.raw_data());
    if (saved == w.spec && (!saved.split || saved.parts == d_.tp)) {
      const int tp = saved.split ? d_.tp_rank : d_.tp_rank % saved_tp_;
      fetch(kind, w.name, tp, pp, w.local, dtype, lo, hi, dst, dp);
      return;
    }
    Gather g{&w, empty(full, dtype), saved, {}};
    const Shape local = local_shape(full, saved, where);
    for (int64_t r : covering_ranks(saved)) {
      Tensor part = empty(local, dtype);
      g.parts.emplace_back(r, part);
      fetch(kind, w.name, static_cast<int>(r), pp, local, dtype, 0, numel_of(local),
            static_cast<char*>(part.raw_data()), dp);
    }
    gathers_.push_back(std::move(g));
  } catch (const ShapeError& x) {  // a split the recorded shape does not allow
    throw CheckpointError(str("[load_checkpoint] ", where, ": ", x.what()));
  }
}

void Stager::stage(const char* kind, const json& table, std::vector<Want>& wants,
                   StageOptions opts) {
  const bool strict = opts.strict, check_unexpected = opts.check_unexpected;
  reads_.clear();
  gathers_.clear();
  std::vector<std::string> missing;
  std::vector<Want*> kept;
  for (auto& w : wants) {
    if (!table.contains(w.name)) {
      missing.push_back(w.name);
      continue;
    }
    kept.push_back(&w);
    plan(kind, table[w.name], w);
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
  for (auto& [rel, tensors] : reads_) read_file(rel, tensors);
  reads_.clear();
  for (auto& g : gathers_) {
    for (auto& [r, part] : g.parts) shard_view(g.full, g.saved, r).copy_(part);
    Want& w = *g.want;
    Tensor mine = shard_view(g.full, w.spec, d_.tp_rank);
    if (w.ranged())
      w.staged.copy_(mine.contiguous().view({-1}).narrow(0, w.lo, w.hi - w.lo));
    else
      w.staged.copy_(mine);
  }
  gathers_.clear();
  for (auto& w : wants)  // a down-cast save: into the target's dtype
    if (w.staged.defined() && w.staged.dtype() != w.target.dtype())
      w.staged = w.staged.to(w.target.dtype());
  wants.erase(
      std::remove_if(wants.begin(), wants.end(), [](const Want& w) { return !w.staged.defined(); }),
      wants.end());
}

bool Stager::in_dp_files(const char* kind) const {
  return std::strcmp(kind, "optim") == 0 ? zero1_ : zero3_;
}

const DpIndex& Stager::dp_index(const char* kind, int tp, int pp) {
  auto it = dp_.find({kind, tp, pp});
  if (it == dp_.end())
    it = dp_.emplace(std::tuple{std::string(kind), tp, pp},
                     index_dp_files(dir_, {.dp_size = saved_dp_,
                                           .tp_rank = tp,
                                           .pp_rank = pp,
                                           .compressed = compressed_,
                                           .kind = kind}))
             .first;
  return it->second;
}

void Stager::fetch(const char* kind, const std::string& name, int tp, int pp, const Shape& local,
                   DType dtype, int64_t lo, int64_t hi, char* dst, int dp) {
  if (hi <= lo) return;
  if (!in_dp_files(kind)) {  // the whole tensor in DP rank dp's file
    FileTensor& ft = reads_[shard_file(
        kind, {.dp_rank = dp, .tp_rank = tp, .pp_rank = pp, .compressed = compressed_})][name];
    ft.dtype = dtype;
    ft.shape = local;
    ft.copies.push_back({lo, hi - lo, dst});
    return;
  }
  const DpIndex& idx = dp_index(kind, tp, pp);
  const auto it = idx.tensors.find(name);
  if (it == idx.tensors.end())
    throw CheckpointError(str("[load_checkpoint] ", dir_.string(), ": ", kind, " tensor '", name,
                              "' is listed in metadata.json but in no DP shard of tp rank ", tp,
                              " pp rank ", pp));
  const DpIndex::Entry& e = it->second;
  if (e.shape != local || e.dtype != dtype)
    throw CheckpointError(str("[load_checkpoint] ", dir_.string(), ": ", kind, " tensor '", name,
                              "' is ", io::safetensors_dtype(e.dtype), shape_str(e.shape),
                              " in the DP shards of tp rank ", tp, " pp rank ", pp, ", expected ",
                              io::safetensors_dtype(dtype), shape_str(local)));
  const int64_t es = dtype_size(dtype);
  for (const Piece& p : e.pieces) {
    const int64_t a = std::max(lo, p.lo), b = std::min(hi, p.hi);
    if (b <= a) continue;
    FileTensor& ft = reads_[p.file][name];
    ft.dtype = dtype;
    ft.shape = e.step ? Shape{} : Shape{p.hi - p.lo};
    ft.copies.push_back({a - p.lo, b - a, dst + (a - lo) * es});
    if (e.step) break;  // a step: the first file that has it
  }
}

void Stager::read_file(const std::string& rel, std::map<std::string, FileTensor>& tensors) {
  const fs::path p = dir_ / rel;
  if (!fs::exists(p)) throw CheckpointError(str("[load_checkpoint] missing shard ", p.string()));
  io::SafetensorsReader r(p);
  check_shard_identity(r.header(), rel, p.string(), "[load_checkpoint]");
  for (const auto& [name, ft] : tensors) {
    const io::TensorInfo* t = r.header().find(name);
    if (!t)
      throw CheckpointError(str("[load_checkpoint] ", p.string(), ": tensor '", name,
                                "' is listed in metadata.json but not in the file"));
    if (t->shape != ft.shape || t->dtype != ft.dtype)
      throw CheckpointError(str("[load_checkpoint] ", p.string(), ": tensor '", name, "' is ",
                                io::safetensors_dtype(t->dtype), shape_str(t->shape), ", expected ",
                                io::safetensors_dtype(ft.dtype), shape_str(ft.shape)));
  }
  // a tensor read whole goes straight to its destination; parts of one through a temporary
  std::map<std::string, Tensor> temps;
  r.read([&](const io::TensorInfo& t) -> void* {
    auto it = tensors.find(t.name);
    if (it == tensors.end() || t.nbytes() == 0) return nullptr;
    const FileTensor& ft = it->second;
    const int64_t n = numel_of(ft.shape);
    if (ft.copies.size() == 1 && ft.copies[0].src == 0 && ft.copies[0].n == n)
      return ft.copies[0].dst;
    Tensor tmp = empty({n}, ft.dtype);
    temps[t.name] = tmp;
    return tmp.raw_data();
  });
  for (const auto& [name, tmp] : temps) {
    const FileTensor& ft = tensors.at(name);
    const int64_t es = dtype_size(ft.dtype);
    for (const Copy& c : ft.copies)
      std::memcpy(c.dst, static_cast<const char*>(tmp.raw_data()) + c.src * es,
                  static_cast<size_t>(c.n * es));
  }
}

}  // namespace nxd::ckpt::detail

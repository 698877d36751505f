// verify_checkpoint (nxd-ckpt verify): every file of a checkpoint read and checked as load does,
// plus what a load at other degrees would find only later: every tensor metadata.json lists is in
// its files, and MoE experts are each in exactly one file.
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/dp_shards.h"
#include "nxd/checkpoint/integrity.h"
#include "nxd/checkpoint/layout.h"
#include "nxd/checkpoint/offline.h"

namespace nxd::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// What load checks of a shard (integrity.h), and that its header agrees with metadata.json (dtypes,
// whole shapes); then every tensor is read (checksums) and model tensors must be finite.
void verify_shard(const json& meta, const std::string& rel, io::SafetensorsReader& r,
                  VerifyReport& rep) {
  const std::string p = r.path().string();
  detail::check_shard_identity(r.header(), rel, p, "[verify]");  // its size: check_listed_files
  const bool model = rel.rfind("model/", 0) == 0;
  const bool zero1_optim = !model && saved_layout(meta).zero1;
  const bool zero3_model = model && rel.rfind("model/zero3_", 0) == 0;
  if (zero3_model)  // blocks of the listed tensors: their ranges index_dp_files checks below
    for (const auto& t : r.header().tensors) {
      const json& table = meta.at("model");
      if (!table.contains(t.name) ||
          table.at(t.name).at("dtype").get<std::string>() != io::safetensors_dtype(t.dtype))
        throw CheckpointError(str("[verify] ", p, ": tensor '", t.name, "' (",
                                  io::safetensors_dtype(t.dtype),
                                  ") is not listed in metadata.json with that dtype"));
    }
  if (!zero1_optim && !zero3_model) {  // ZeRO-1 files hold parts: index_dp_files checks them
    const json& table = model ? meta.at("model") : meta.at("optimizer").at("tensors");
    const auto specs = detail::specs_of(r.header(), rel);
    for (const auto& t : r.header().tensors) {
      if (!table.contains(t.name))
        throw CheckpointError(
            str("[verify] ", p, ": tensor '", t.name, "' is not listed in metadata.json"));
      const json& e = table.at(t.name);
      auto it = specs.find(t.name);
      const Shape whole = full_shape(t.shape, it == specs.end() ? ShardSpec{} : it->second);
      if (e.at("dtype").get<std::string>() != io::safetensors_dtype(t.dtype) ||
          e.at("shape").get<Shape>() != whole)
        throw CheckpointError(str("[verify] ", p, ": tensor '", t.name, "' is ",
                                  io::safetensors_dtype(t.dtype), shape_str(whole),
                                  " (whole), metadata.json says ", e.at("dtype").get<std::string>(),
                                  e.at("shape").dump()));
    }
  }
  std::vector<char> buf;
  std::optional<io::TensorInfo> last;  // the tensor in buf, checked when the next one starts
  auto finite = [&] {
    if (!last || !model) return;
    if (const int64_t bad = detail::count_nonfinite(
            buf.data(), last->nbytes() / dtype_size(last->dtype), last->dtype))
      throw CheckpointError(str("[verify] ", p, ": model tensor '", last->name, "' holds ", bad,
                                " NaN or infinite value(s)"));
  };
  r.read([&](const io::TensorInfo& t) -> void* {
    finite();
    ++rep.tensors;
    rep.bytes += t.nbytes();
    buf.resize(static_cast<size_t>(t.nbytes()) + 1);
    last = t;
    return buf.data();
  });
  finite();
}

// The file kinds, (tp, pp) ranks and DP ranks of the shards holding each tensor (model files and
// an unsharded optimizer's; ZeRO-1 files hold parts, checked by index_dp_files).
struct Holders {
  // (kind, tp, pp) -> tensor name -> DP ranks of the files that hold it
  std::map<std::tuple<std::string, int, int>, std::map<std::string, std::vector<int>>> by_rank;
  void add(const std::string& rel, const io::SafetensorsHeader& h) {
    char kind[16] = {0};
    int dp = -1, tp = -1, pp = -1;
    if (std::sscanf(rel.c_str(), "%15[a-z]/dp_rank_%d_tp_rank_%d_pp_rank_%d", kind, &dp, &tp,
                    &pp) != 4)
      return;
    auto& names = by_rank[{kind, tp, pp}];
    for (const auto& t : h.tensors) names[t.name].push_back(dp);
  }
};

// "<prefix>.experts.<e>.<suffix>": e, and the name with e as '*' (the expert weight it is one of).
std::optional<std::pair<int64_t, std::string>> expert_of(const std::string& name) {
  const std::string key = ".experts.";
  const auto at = name.find(key);
  if (at == std::string::npos) return std::nullopt;
  const size_t b = at + key.size();
  size_t e = b;
  while (e < name.size() && name[e] >= '0' && name[e] <= '9') ++e;
  if (e == b || e - b > 9 || e >= name.size() || name[e] != '.') return std::nullopt;
  return std::pair{std::stoll(name.substr(b, e - b)), name.substr(0, b) + "*" + name.substr(e)};
}

struct ExpertLayout {
  SavedLayout saved;
  int64_t num_experts = 0;  // model_config's moe.num_experts (0: unknown, from the names)
};

// One table ("model", or an unsharded optimizer's "optim"): every listed tensor is in the file of
// every (tp, pp) rank that should hold it, an expert only in the file of its EP rank (the
// dp_rank metadata.json records), anything else only in DP rank 0's; every expert of every
// expert weight is listed, with one shape.
void check_table(const fs::path& dir, const char* kind, const json& table, const Holders& h,
                 const ExpertLayout& x, VerifyReport& rep) {
  const std::string pre = str("[verify] ", dir.string(), ": ");
  std::map<std::string, std::map<int64_t, Shape>> weights;  // expert weight -> expert -> shape
  auto file = [&](int dp, int tp, int pp) {
    return (dir /
            detail::shard_file(
                kind,
                {.dp_rank = dp, .tp_rank = tp, .pp_rank = pp, .compressed = x.saved.compressed}))
        .string();
  };
  for (const auto& [name, e] : table.items()) {
    const int pp = e.at("pp_rank").get<int>(), dp = e.value("dp_rank", 0);
    const auto ex = expert_of(name);
    if (ex) {
      weights[ex->second][ex->first] = e.at("shape").get<Shape>();
      ++rep.experts;
      const int ep = x.saved.ep;
      if (x.num_experts > 0 && x.num_experts % ep == 0 && ex->first < x.num_experts) {
        const int owner = static_cast<int>(ex->first / (x.num_experts / ep));
        if (dp != owner)
          throw CheckpointError(str(pre, kind, " tensor '", name, "' of expert ", ex->first,
                                    " is recorded at dp_rank ", dp, ", but at expert_parallel ", ep,
                                    " it belongs to EP rank ", owner, "'s file"));
      }
    } else if (dp != 0) {
      throw CheckpointError(str(pre, kind, " tensor '", name, "' is not an expert weight but ",
                                "metadata.json records it at dp_rank ", dp));
    }
    for (int tp = 0; tp < x.saved.tp; ++tp) {
      const auto r = h.by_rank.find({kind, tp, pp});
      const std::vector<int>* in = nullptr;
      if (r != h.by_rank.end())
        if (auto it = r->second.find(name); it != r->second.end()) in = &it->second;
      if (!in || std::find(in->begin(), in->end(), dp) == in->end())
        throw CheckpointError(
            str(pre, kind, " tensor '", name, "' is listed in metadata.json ", "but not in ",
                file(dp, tp, pp),
                ex ? str(" (expert ", ex->first, ": a missing expert shard)") : std::string()));
      for (int other : *in)
        if (other != dp)
          throw CheckpointError(
              str(pre, kind, " tensor '", name, "' is in both ", file(dp, tp, pp), " and ",
                  file(other, tp, pp),
                  ex ? " (an expert held by two EP ranks: a duplicated expert shard)"
                     : " (only DP rank 0's file holds tensors that are not experts)"));
    }
  }
  for (const auto& [w, experts] : weights) {
    const int64_t n = x.num_experts > 0 ? x.num_experts : experts.rbegin()->first + 1;
    for (int64_t e = 0; e < n; ++e)
      if (!experts.count(e))
        throw CheckpointError(str(pre, kind, " expert weight '", w, "' has no expert ", e,
                                  " (model_config has ", n, " experts): a missing expert shard"));
    if (experts.rbegin()->first >= n)
      throw CheckpointError(str(pre, kind, " expert weight '", w, "' has expert ",
                                experts.rbegin()->first, ", model_config has ", n, " experts"));
    for (const auto& [e, s] : experts)
      if (s != experts.begin()->second)
        throw CheckpointError(str(pre, kind, " expert ", e, " of '", w, "' is ", shape_str(s),
                                  ", expert ", experts.begin()->first, "'s is ",
                                  shape_str(experts.begin()->second)));
  }
}

// Every expert tensor of a table assembled from DP files (a ZeRO-1 optimizer's state, "optimizer
// state"; a ZeRO-3 model's blocks, "model tensor") is there for every expert.
void check_expert_names(const fs::path& dir, const json& table, const ExpertLayout& x,
                        const char* what) {
  std::map<std::string, std::set<int64_t>> weights;
  for (const auto& [name, e] : table.items())
    if (const auto ex = expert_of(name)) weights[ex->second].insert(ex->first);
  for (const auto& [w, experts] : weights)
    for (int64_t e = 0; e < std::max(x.num_experts, *experts.rbegin() + 1); ++e)
      if (!experts.count(e))
        throw CheckpointError(str("[verify] ", dir.string(), ": ", what, " '", w,
                                  "' has no expert ", e, " in any DP shard"));
}

}  // namespace

VerifyReport verify_checkpoint(const fs::path& tag_dir) {
  const json meta = read_metadata(tag_dir);
  VerifyReport rep;
  Holders holders;
  ExpertLayout x;
  x.saved = saved_layout(meta);
  const bool zero1 = x.saved.zero1;
  // the loader's checks of the file list and side files (integrity.h: one list)
  (void)detail::check_listed_files(tag_dir, meta, "[verify]");
  for (const auto& [rel, info] : meta.at("files").items()) {
    const fs::path p = tag_dir / rel;
    const bool dp_file = (zero1 && rel.rfind("optim/", 0) == 0) ||
                         (x.saved.zero3 && rel.rfind("model/zero3_", 0) == 0);
    if (!fs::exists(p)) {
      if (dp_file) continue;  // index_dp_files below names it with the elements it held
      throw CheckpointError(str("[verify] missing file ", p.string()));
    }
    ++rep.files;
    if (rel.find(".safetensors") == std::string::npos) continue;
    io::SafetensorsReader r(p);
    verify_shard(meta, rel, r, rep);
    if (!(zero1 && rel.rfind("optim/", 0) == 0)) holders.add(rel, r.header());
  }
  if (meta.contains("model_config") && meta["model_config"].contains("moe"))
    x.num_experts = meta["model_config"]["moe"].value("num_experts", int64_t{0});
  if (meta.contains("model") && !x.saved.zero3)
    check_table(tag_dir, "model", meta["model"], holders, x, rep);
  if (meta.contains("optimizer") && !zero1)
    check_table(tag_dir, "optim", meta["optimizer"].at("tensors"), holders, x, rep);
  if (meta.contains("optimizer") && zero1)
    check_expert_names(tag_dir, meta["optimizer"].at("tensors"), x, "optimizer state");
  // ZeRO-3 blocks: every expert of every expert weight, each tiled by its EP rank's expert-DP
  // files (tiles below)
  if (meta.contains("model") && x.saved.zero3)
    check_expert_names(tag_dir, meta["model"], x, "model tensor");
  // ZeRO-1 (ZeRO-3): the DP files of every (tp, pp) rank tile every state (model) tensor, and
  // every tensor metadata.json lists is in them
  auto tiles = [&](const char* kind, const json& table) {
    for (int pp = 0; pp < x.saved.pp; ++pp)
      for (int tp = 0; tp < x.saved.tp; ++tp) {
        const auto idx = detail::index_dp_files(tag_dir, {.dp_size = x.saved.dp,
                                                          .tp_rank = tp,
                                                          .pp_rank = pp,
                                                          .compressed = x.saved.compressed,
                                                          .kind = kind});
        for (const auto& [name, e] : table.items())
          if (e.at("pp_rank").get<int>() == pp && !idx.tensors.count(name))
            throw CheckpointError(str("[verify] ", tag_dir.string(), ": ", kind, " tensor '", name,
                                      "' is listed in metadata.json but in no DP shard of tp rank ",
                                      tp, " pp rank ", pp));
      }
  };
  if (zero1) tiles("optim", meta["optimizer"].at("tensors"));
  if (x.saved.zero3) tiles("model", meta["model"]);
  return rep;
}

}  // namespace nxd::ckpt

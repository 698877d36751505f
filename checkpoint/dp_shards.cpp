#include "nxd/checkpoint/dp_shards.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "nxd/checkpoint/layout.h"

namespace nxd::ckpt::detail {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string zero1_json(const std::vector<const optim::StateShard*>& records) {
  json j = json::object();
  for (const optim::StateShard* r : records)
    j[r->param] = {{"range", {r->lo, r->hi}}, {"shape", r->shape}};
  return j.dump();
}

namespace {

struct Range {
  int64_t lo = 0, hi = 0;
  Shape shape;
};

// "nxd.zero1" of one file, validated.
std::map<std::string, Range> ranges_of(const io::SafetensorsHeader& h, const std::string& file) {
  auto it = h.metadata.find(kZero1Key);
  if (it == h.metadata.end())
    throw CheckpointError(str("[checkpoint] ", file, " has no ", kZero1Key,
                              " metadata (not a ZeRO-1 optimizer shard)"));
  json j;
  try {
    j = json::parse(it->second);
  } catch (const std::exception& e) {
    throw CheckpointError(str("[checkpoint] ", file, ": ", kZero1Key, " is not JSON: ", e.what()));
  }
  if (!j.is_object())
    throw CheckpointError(str("[checkpoint] ", file, ": ", kZero1Key, " is not an object"));
  std::map<std::string, Range> out;
  for (const auto& [name, v] : j.items()) {
    const std::string where = str(file, ": parameter '", name, "' in ", kZero1Key);
    Range r;
    bool ok = v.is_object() && v.contains("range") && v.contains("shape") &&
              v["range"].is_array() && v["range"].size() == 2 && v["shape"].is_array();
    ok = ok && v["range"][0].is_number_integer() && v["range"][1].is_number_integer();
    int64_t numel = 1;
    if (ok) {
      r.lo = v["range"][0].get<int64_t>();
      r.hi = v["range"][1].get<int64_t>();
      for (const auto& d : v["shape"]) {
        ok = ok && d.is_number_integer() && d.get<int64_t>() >= 0 &&
             (d.get<int64_t>() == 0 || numel <= (int64_t{1} << 50) / d.get<int64_t>());
        if (!ok) break;
        r.shape.push_back(d.get<int64_t>());
        numel *= d.get<int64_t>();
      }
    }
    if (!ok || r.lo < 0 || r.hi < r.lo || r.hi > numel)
      throw CheckpointError(str("[checkpoint] ", where, ": bad entry ", v.dump()));
    out[name] = std::move(r);
  }
  return out;
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Adds one file's tensors to the index.
void add_file(DpIndex& idx, const std::string& rel, const io::SafetensorsHeader& h, bool model) {
  const auto ranges = ranges_of(h, rel);
  for (const io::TensorInfo& t : h.tensors) {
    const auto dot = t.name.rfind('.');
    const bool whole_name = model || dot == std::string::npos;
    const std::string param = whole_name ? t.name : t.name.substr(0, dot);
    const std::string what = whole_name ? "" : t.name.substr(dot + 1);
    const auto r = ranges.find(param);
    if (r == ranges.end())
      throw CheckpointError(str("[checkpoint] ", rel, ": tensor '", t.name, "' belongs to no ",
                                "parameter listed in ", kZero1Key));
    const bool step = what == "step";
    const Shape want = step ? Shape{} : Shape{r->second.hi - r->second.lo};
    // a model block is in the dtype it was saved in (the same in every DP file, checked below)
    const DType want_dtype = step ? DType::i64 : model ? t.dtype : DType::f32;
    if (t.shape != want || t.dtype != want_dtype)
      throw CheckpointError(str("[checkpoint] ", rel, ": tensor '", t.name, "' is ",
                                io::safetensors_dtype(t.dtype), shape_str(t.shape), ", expected ",
                                io::safetensors_dtype(want_dtype), shape_str(want)));
    auto [it, fresh] = idx.tensors.try_emplace(t.name);
    DpIndex::Entry& e = it->second;
    const Shape shape = step ? Shape{} : r->second.shape;
    if (fresh) {
      e.dtype = want_dtype;
      e.shape = shape;
      e.step = step;
    } else if (e.dtype != want_dtype) {
      throw CheckpointError(str("[checkpoint] ", rel, ": tensor '", t.name, "' is ",
                                io::safetensors_dtype(want_dtype), ", another DP shard's part is ",
                                io::safetensors_dtype(e.dtype)));
    } else if (e.shape != shape) {
      throw CheckpointError(str("[checkpoint] ", rel, ": tensor '", t.name, "' is a part of ",
                                shape_str(shape), ", another DP shard says ", shape_str(e.shape)));
    }
    e.pieces.push_back({rel, step ? 0 : r->second.lo, step ? 1 : r->second.hi});
  }
}

}  // namespace

DpIndex index_dp_files(const fs::path& dir, const DpFiles& f) {
  const int dp = f.dp_size, tp = f.tp_rank, pp = f.pp_rank;
  const bool compressed = f.compressed;
  DpIndex idx;
  std::vector<std::string> missing;
  for (int d = 0; d < dp; ++d) {
    const bool model = f.kind == "model";
    const std::string rel =
        shard_file(f.kind, {.dp_rank = d,
                            .tp_rank = tp,
                            .pp_rank = pp,
                            .compressed = compressed,
                            .files = model ? ShardFiles::zero3_blocks : ShardFiles::whole});
    if (!fs::exists(dir / rel)) {
      missing.push_back((dir / rel).string());
      continue;
    }
    io::SafetensorsReader r(dir / rel);
    add_file(idx, rel, r.header(), model);
    idx.files.push_back(
        {rel, r.file_size(), static_cast<int64_t>(r.header().tensors.size()), r.header()});
  }
  const std::string lost = missing.empty() ? "" : str(" (missing shard ", missing.front(), ")");
  if (!missing.empty() && idx.tensors.empty())
    throw CheckpointError(str("[checkpoint] missing shard ", missing.front()));
  for (auto& [name, e] : idx.tensors) {
    if (e.step) continue;  // a step: any file that has it
    std::sort(e.pieces.begin(), e.pieces.end(),
              [](const Piece& a, const Piece& b) { return a.lo < b.lo; });
    int64_t at = 0;
    for (const Piece& p : e.pieces) {
      if (p.lo != at)
        throw CheckpointError(
            str("[checkpoint] ", (dir / p.file).string(), ": tensor '", name,
                "' starts at element ", p.lo, ", expected ", at,
                p.lo > at ? str(": elements [", at, ", ", p.lo, ") are in no DP shard", lost)
                          : std::string(" (DP shards overlap)")));
      at = p.hi;
    }
    const int64_t n = numel_of(e.shape);
    if (at != n)
      throw CheckpointError(str("[checkpoint] ", dir.string(), ": tensor '", name, "' of tp rank ",
                                tp, " pp rank ", pp, ": elements [", at, ", ", n,
                                ") are in no DP shard", lost));
  }
  if (!missing.empty())  // every element is elsewhere, yet a file listed in metadata is gone
    throw CheckpointError(str("[checkpoint] missing shard ", missing.front()));
  return idx;
}

}  // namespace nxd::ckpt::detail

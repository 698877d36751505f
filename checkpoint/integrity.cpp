#include "nxd/checkpoint/integrity.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "nxd/checkpoint/error.h"
#include "nxd/checkpoint/layout.h"
#include "nxd/checkpoint/metadata.h"
#include "nxd/io/bounded_read.h"
#include "nxd/io/safetensors.h"

namespace nxd::ckpt::detail {

void check_shard_identity(const io::SafetensorsHeader& h, const std::string& rel,
                          const std::string& path, const char* prefix) {
  char kind[16] = {0};
  int dp = -1, tp = -1, pp = -1;
  if (std::sscanf(rel.c_str(), "%15[a-z]/dp_rank_%d_tp_rank_%d_pp_rank_%d", kind, &dp, &tp, &pp) !=
          4 &&
      std::sscanf(rel.c_str(), "%15[a-z]/zero3_dp_rank_%d_tp_rank_%d_pp_rank_%d", kind, &dp, &tp,
                  &pp) != 4)
    return;  // not a shard name of this layout (checked by metadata.json's file list)
  const std::string want_kind = std::strcmp(kind, "model") == 0 ? "model" : "optimizer";
  auto field = [&](const char* key) -> std::string {
    auto it = h.metadata.find(key);
    return it == h.metadata.end() ? std::string("(none)") : it->second;
  };
  auto check = [&](const char* key, const std::string& want) {
    const std::string got = field(key);
    if (got != want)
      throw CheckpointError(str(prefix, " ", path, ": records ", key, "=", got,
                                " but its file name says ", want,
                                " (a shard file swapped or copied from another rank)"));
  };
  check("nxd.kind", want_kind);
  check("nxd.tp_rank", std::to_string(tp));
  check("nxd.pp_rank", std::to_string(pp));
  check("nxd.dp_rank", std::to_string(dp));
  for (const auto& t : h.tensors)
    if (!t.crc)
      throw CheckpointError(str(prefix, " ", path, ": tensor '", t.name,
                                "' has no checksum (nxd.crc32c.", t.name, ")"));
}

int64_t count_nonfinite(const void* data, int64_t n, DType dtype) {
  int64_t bad = 0;
  if (dtype == DType::f32) {
    const float* p = static_cast<const float*>(data);
    for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(p[i]);
  } else if (dtype == DType::f64) {
    const double* p = static_cast<const double*>(data);
    for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(p[i]);
  } else if (dtype == DType::bf16) {
    const uint16_t* p = static_cast<const uint16_t*>(data);
    for (int64_t i = 0; i < n; ++i) bad += (p[i] & 0x7f80) == 0x7f80;  // exponent all ones
  }
  return bad;
}

nlohmann::json read_side_file(const std::filesystem::path& tag_dir, const std::string& rel,
                              const nlohmann::json& meta, const char* prefix) {
  const std::string p = (tag_dir / rel).string();
  const std::string text = io::read_file(p, int64_t{16} << 20);
  const nlohmann::json* info = nullptr;
  if (meta.contains("files") && meta["files"].is_object() && meta["files"].contains(rel))
    info = &meta["files"][rel];
  if (info && info->is_object() && info->contains("bytes") &&
      (*info)["bytes"] != static_cast<int64_t>(text.size()))
    throw CheckpointError(str(prefix, " ", p, " has ", text.size(), " bytes, metadata.json says ",
                              io::shorten((*info)["bytes"].dump()), " (truncated or replaced)"));
  try {
    io::check_flow_depth(text, /*yaml=*/false, p, "checkpoint");
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw CheckpointError(str(prefix, " ", p, " is not valid JSON: ", io::shorten(e.what(), 200)));
  }
}

optim::LRScheduleOptions read_scheduler(const std::filesystem::path& tag_dir,
                                        const nlohmann::json& meta, const char* prefix) {
  const nlohmann::json j = read_side_file(tag_dir, kScheduler, meta, prefix);
  try {
    optim::LRScheduleOptions o;
    o.kind = optim::schedule_kind_from_name(j.at("kind").get<std::string>());
    o.lr = j.at("lr").get<double>();
    o.min_lr = j.at("min_lr").get<double>();
    o.warmup_steps = j.at("warmup_steps").get<int64_t>();
    o.decay_steps = j.at("decay_steps").get<int64_t>();
    optim::LRSchedule check(o);  // validates
    return o;
  } catch (const std::exception& e) {
    throw CheckpointError(
        str(prefix, " ", (tag_dir / kScheduler).string(), ": ", io::shorten(e.what(), 200)));
  }
}

void check_user_content(const nlohmann::json& user, const std::string& path, const char* prefix) {
  if (!user.is_object() || !user.contains("trainer")) return;
  auto bad = [&](const std::string& key, const std::string& why) {
    throw CheckpointError(str(prefix, " ", path, ": trainer", key, " ", why));
  };
  // j[key] (named trainer<at>.<key>) an integer in [0, kMaxLoopCount]
  auto count = [&](const nlohmann::json& j, const std::string& at, const char* key, bool required) {
    const std::string name = at + "." + key;
    if (!j.contains(key)) {
      if (required) bad(name, "is missing");
      return;
    }
    const nlohmann::json& v = j[key];
    if (!v.is_number_integer()) bad(name, str("= ", io::shorten(v.dump()), " is not an integer"));
    if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(kMaxLoopCount)
                               : (v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxLoopCount))
      bad(name, str("= ", v.dump(), " is outside [0, ", kMaxLoopCount, "]"));
  };
  const nlohmann::json& t = user["trainer"];
  if (!t.is_object()) bad("", str("is ", io::shorten(t.dump()), ", not a mapping"));
  count(t, "", "step", /*required=*/true);
  for (const char* k : {"dp_size", "batches", "lr_scheduler_steps"}) count(t, "", k, false);
  for (const char* k : {"rng_seed", "rng_counter"})
    if (t.contains(k) && !t[k].is_number_unsigned() &&
        !(t[k].is_number_integer() && t[k].get<int64_t>() >= 0))
      bad(str(".", k), str("= ", io::shorten(t[k].dump()), " is not an unsigned integer"));
  if (t.contains("data") && !t["data"].is_null()) {
    if (!t["data"].is_object()) bad(".data", str("is ", io::shorten(t["data"].dump())));
    count(t["data"], ".data", "epoch", true);
    count(t["data"], ".data", "position", true);
  }
}

SideFiles check_listed_files(const std::filesystem::path& tag_dir, const nlohmann::json& meta,
                             const char* prefix) {
  SideFiles out;
  const SavedLayout saved = saved_layout(meta);
  for (const auto& [rel, info] : meta.at("files").items()) {
    const std::filesystem::path p = tag_dir / rel;
    std::error_code ec;
    const auto size = std::filesystem::file_size(p, ec);
    if (ec) {
      // per-DP-rank files: dp_shards.h names the tensors a missing one held
      if (saved.zero1 && rel.rfind("optim/", 0) == 0) continue;
      if (saved.zero3 && rel.rfind("model/zero3_", 0) == 0) continue;
      throw CheckpointError(str(prefix, " missing file ", p.string()));
    }
    const nlohmann::json& want = info.at("bytes");
    if (!want.is_number_integer() || want.get<int64_t>() != static_cast<int64_t>(size)) {
      const std::string says = io::shorten(want.dump());
      if (rel.find(".safetensors") != std::string::npos) {
        try {  // a truncated shard: its reader names the tensor the truncation cuts
          io::SafetensorsReader r(p);
        } catch (const std::exception& e) {
          throw CheckpointError(
              str(prefix, " ", e.what(), " (metadata.json says ", says, " bytes)"));
        }
      }
      throw CheckpointError(str(prefix, " ", p.string(), " has ", size,
                                " bytes, metadata.json says ", says, " (truncated or replaced)"));
    }
    if (rel == kScheduler) {
      out.scheduler = read_scheduler(tag_dir, meta, prefix);
    } else if (rel == kUserContent) {
      out.user = read_side_file(tag_dir, rel, meta, prefix);
      check_user_content(out.user, p.string(), prefix);
    } else if (rel.find(".safetensors") == std::string::npos) {
      (void)read_side_file(tag_dir, rel, meta, prefix);
    }
  }
  return out;
}

}  // namespace nxd::ckpt::detail

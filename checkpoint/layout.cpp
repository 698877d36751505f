#include "nxd/checkpoint/layout.h"

#include <algorithm>
#include <climits>
#include <cstdio>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/collectives/communicator.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/attributes.h"

namespace nxd::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace detail {

Degrees current_degrees() {
  namespace ps = parallel_state;
  Degrees d;
  Context& ctx = current_context();
  d.world = ctx.world_size();
  d.rank = ctx.rank();
  d.tp = ps::get_tensor_model_parallel_size();
  d.pp = ps::get_pipeline_model_parallel_size();
  // the data x context group (DP at CP 1): CP ranks hold the same parameters as DP ranks do, and
  // ZeRO-1 shards its state over both, so a checkpoint's "dp" shards are DP x CP's
  d.dp = ps::get_data_context_parallel_size();
  d.tp_rank = ps::get_tensor_model_parallel_rank();
  d.pp_rank = ps::get_pipeline_model_parallel_rank();
  d.dp_rank = ps::get_data_context_parallel_rank();
  d.cp = ps::get_context_parallel_size();
  d.cp_rank = ps::get_context_parallel_rank();
  d.data_rank = ps::get_data_parallel_rank();
  d.ep = ps::get_expert_model_parallel_size();
  d.ep_rank = ps::get_expert_model_parallel_rank();
  d.expert_dp = ps::get_expert_data_parallel_size();
  d.expert_dp_rank = ps::get_expert_data_parallel_rank();
  return d;
}

std::string shard_file(const std::string& kind, const ShardName& s) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "dp_rank_%02d_tp_rank_%02d_pp_rank_%02d", s.dp_rank, s.tp_rank,
                s.pp_rank);
  return kind + (s.files == ShardFiles::zero3_blocks ? "/zero3_" : "/") + buf +
         (s.compressed ? ".safetensors.zst" : ".safetensors");
}

std::string broadcast_string(const std::string& s) {
  Communicator& w = world();
  if (w.size() == 1) return s;
  int64_t n = static_cast<int64_t>(s.size());
  w.broadcast(&n, 1, DType::i64, 0);
  std::vector<int32_t> buf(static_cast<size_t>(n));
  if (w.rank() == 0)
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<unsigned char>(s[i]);
  if (n > 0) w.broadcast(buf.data(), n, DType::i32, 0);
  std::string out(static_cast<size_t>(n), '\0');
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<char>(buf[i]);
  return out;
}

void run_agreed(const char* what, const std::function<void()>& f) {
  std::exception_ptr err;
  std::string msg;
  try {
    f();
  } catch (const std::exception& e) {
    err = std::current_exception();
    msg = e.what();
  } catch (...) {
    err = std::current_exception();
    msg = "unknown error";
  }
  Communicator& w = world();
  if (w.size() == 1) {
    if (err) std::rethrow_exception(err);
    return;
  }
  int32_t first = err ? w.rank() : INT32_MAX;
  w.all_reduce(&first, &first, 1, DType::i32, ReduceOp::min);
  if (first == INT32_MAX) return;
  // the failing rank's message, to every rank
  int64_t n = static_cast<int64_t>(msg.size());
  w.broadcast(&n, 1, DType::i64, first);
  std::vector<int32_t> buf(static_cast<size_t>(n));
  for (int64_t i = 0; i < n && w.rank() == first; ++i) buf[i] = static_cast<unsigned char>(msg[i]);
  if (n > 0) w.broadcast(buf.data(), n, DType::i32, first);
  if (err && w.rank() == first) std::rethrow_exception(err);
  std::string m(static_cast<size_t>(n), '\0');
  for (int64_t i = 0; i < n; ++i) m[i] = static_cast<char>(buf[i]);
  throw CheckpointError(str(what, " failed on rank ", first, ": ", m));
}

std::map<std::string, ShardSpec> model_specs(const std::vector<const Module*>& chunks) {
  std::map<std::string, ShardSpec> out;
  for (const Module* m : chunks)
    for (const auto& p : parallel_parameters(const_cast<Module&>(*m))) {
      const ShardSpec s = shard_spec(p.attrs);
      if (s.split) out[p.name] = s;
    }
  return out;
}

std::map<std::string, ShardSpec> specs_of(const io::SafetensorsHeader& h, const std::string& file) {
  std::map<std::string, ShardSpec> out;
  auto it = h.metadata.find("nxd.parallel");
  if (it == h.metadata.end()) return out;
  json j;
  try {
    j = json::parse(it->second);
  } catch (const std::exception& e) {
    throw CheckpointError(str("[checkpoint] ", file, ": nxd.parallel is not JSON: ", e.what()));
  }
  if (!j.is_object())
    throw CheckpointError(str("[checkpoint] ", file, ": nxd.parallel is not an object"));
  for (const auto& [name, v] : j.items())
    out[name] = shard_spec_from_json(v, str(file, ": tensor '", name, "'"));
  return out;
}

void apply_retention(const fs::path& path, int keep, const std::string& current) {
  if (keep <= 0) return;
  const auto tags = list_checkpoints(path);
  std::vector<TagInfo> complete;
  for (const auto& t : tags) {
    if (t.complete) {
      complete.push_back(t);
    } else if (t.tag != current) {
      std::error_code ec;
      fs::remove_all(path / t.tag, ec);  // an interrupted save (or an interrupted removal)
    }
  }
  const int extra = static_cast<int>(complete.size()) - keep;
  for (int i = 0; i < extra; ++i) {
    const fs::path dir = path / complete[i].tag;
    std::error_code ec;
    fs::remove(dir / kDone, ec);  // no longer complete before anything else goes
    io::fsync_dir(dir);
    fs::remove_all(dir, ec);
  }
  io::fsync_dir(path);
}

}  // namespace detail

std::vector<TagInfo> list_checkpoints(const fs::path& path) {
  std::vector<TagInfo> done, partial;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return {};
  for (const auto& e : fs::directory_iterator(path, ec)) {
    if (!e.is_directory() || !fs::exists(e.path() / detail::kMarker)) continue;
    if (e.path().filename().string().starts_with(".")) continue;  // a re-save's aside folder
    TagInfo t;
    t.tag = e.path().filename().string();
    if (fs::exists(e.path() / detail::kDone)) {
      try {
        const json d = json::parse(io::read_file(e.path() / detail::kDone));
        t.seq = d.at("seq").get<int64_t>();
        t.complete = true;
      } catch (const std::exception&) {
        t.complete = false;  // an unreadable marker does not count
      }
    }
    (t.complete ? done : partial).push_back(t);
  }
  std::sort(done.begin(), done.end(), [](const TagInfo& a, const TagInfo& b) {
    return a.seq != b.seq ? a.seq < b.seq : a.tag < b.tag;
  });
  std::sort(partial.begin(), partial.end(),
            [](const TagInfo& a, const TagInfo& b) { return a.tag < b.tag; });
  done.insert(done.end(), partial.begin(), partial.end());
  return done;
}

std::optional<std::string> newest_checkpoint(const fs::path& path) {
  std::optional<std::string> out;
  for (const auto& t : list_checkpoints(path))
    if (t.complete) out = t.tag;
  return out;
}

void remove_checkpoint(const fs::path& path, const std::string& tag) {
  NXD_CHECK(!tag.empty() && tag.find('/') == std::string::npos, "[remove_checkpoint] bad tag '",
            tag, "'");
  const fs::path dir = path / tag;
  if (!fs::exists(dir / detail::kMarker))
    throw CheckpointError(str("[remove_checkpoint] ", dir.string(), " is not a checkpoint"));
  std::error_code ec;
  fs::remove(dir / detail::kDone, ec);
  io::fsync_dir(dir);
  fs::remove_all(dir, ec);
  io::fsync_dir(path);
}

bool has_checkpoint(const fs::path& path) {
  return newest_checkpoint(path).has_value();
}

json read_metadata(const fs::path& tag_dir) {
  const fs::path p = tag_dir / detail::kMetadata;
  if (!fs::exists(tag_dir / detail::kDone))
    throw CheckpointError(
        str("[checkpoint] ", tag_dir.string(), " is not a complete checkpoint (no done marker)"));
  const json m = parse_metadata(io::read_file(p), p.string());
  return m;
}

}  // namespace nxd::ckpt

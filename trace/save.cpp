#include <nlohmann/json.hpp>

#include "nxd/collectives/communicator.h"
#include "nxd/io/crc32c.h"
#include "nxd/io/fileio.h"
#include "nxd/io/safetensors.h"
#include "nxd/trace/mapped_file.h"
#include "nxd/trace/save_load.h"

namespace nxd::trace {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json plan_json(const CompiledGraph& c) {
  return {{"dce", c.options.dce},
          {"fuse", c.options.fuse},
          {"fused_nodes", c.fused_nodes},
          {"plan", c.options.plan},
          {"removed_nodes", c.removed_nodes},
          {"arena_bytes", c.plan.arena_bytes},
          {"offsets", c.plan.offset}};
}

void check_savable(const Tensor& t, const std::string& name) {
  NXD_CHECK(!t.is_meta(), "[parallel_model_save] '", name,
            "' is a meta tensor: a model traced on meta tensors has no values to save");
}

// One rank's files, relative to dir.
std::vector<std::string> save_rank(const TensorParallelModel& m, const RankProgram& p, int r,
                                   const fs::path& dir) {
  const bool inl = m.options().inline_weights;
  const std::string rd = str("rank", r);
  fs::create_directories(dir / rd);
  std::vector<std::string> files;
  NamedTensors shared;
  if (!inl)
    for (const auto& [name, t] : p.weights) {
      check_savable(t, name);
      shared.emplace_back("param:" + name, t);
    }
  for (const auto& [name, t] : p.state) {
    check_savable(t, name);
    shared.emplace_back("state:" + name, t);
  }
  // every file records its rank (and bucket): files swapped between ranks are refused at load
  const std::string rank_s = std::to_string(r);
  io::write_safetensors(dir / rd / "weights.safetensors", shared,
                        {{"format", "pt"}, {"nxd.trace_rank", rank_s}});
  files.push_back(rd + "/weights.safetensors");
  for (size_t b = 0; b < p.graphs.size(); ++b) {
    const CompiledGraph& c = *p.graphs[b];
    NamedTensors own;
    if (inl)
      for (size_t i = 0; i < c.graph.params.size(); ++i) {
        const std::string& name = c.graph.values[c.graph.params[i]].name;
        check_savable(p.params[b][i], name);
        own.emplace_back("param:" + name, p.params[b][i]);
      }
    for (size_t i = 0; i < p.constants[b].size(); ++i) {
      check_savable(p.constants[b][i], str("const:", i));
      own.emplace_back(str("const:", i), p.constants[b][i]);
    }
    const std::string st = str(rd, "/bucket", b, ".safetensors");
    io::write_safetensors(
        dir / st, own,
        {{"format", "pt"}, {"nxd.trace_rank", rank_s}, {"nxd.trace_bucket", std::to_string(b)}});
    const std::string gj = str(rd, "/bucket", b, ".json");
    const json j = {{"graph", json::parse(graph_to_json(c.graph))},
                    {"compile", plan_json(c)},
                    {"rank", r},
                    {"bucket", b}};
    io::write_file_atomic(dir / gj, j.dump(1));
    files.push_back(st);
    files.push_back(gj);
  }
  return files;
}

json file_entry(const fs::path& path) {
  MappedFile f(path);
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", io::crc32c(f.data(), static_cast<size_t>(f.size())));
  return {{"bytes", f.size()}, {"crc32c", hex}};
}

json manifest(const TensorParallelModel& m, const fs::path& dir) {
  json buckets = json::array(), examples = json::array(), files = json::object();
  for (const Bucket& b : m.buckets()) buckets.push_back({b.batch, b.seq});
  for (const Tensor& t : m.example_inputs())
    examples.push_back({{"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}});
  const int tp = m.tp_degree();
  for (int r = 0; r < tp; ++r) {
    std::vector<std::string> names{str("rank", r, "/weights.safetensors")};
    for (size_t b = 0; b < m.buckets().size(); ++b) {
      names.push_back(str("rank", r, "/bucket", b, ".safetensors"));
      names.push_back(str("rank", r, "/bucket", b, ".json"));
    }
    for (const std::string& n : names) files[n] = file_entry(dir / n);
  }
  return {{"format", "nxd-trace"},
          {"version", kTraceFormatVersion},
          {"tp_degree", tp},
          {"buckets", buckets},
          {"inline_weights", m.options().inline_weights},
          {"pad_batch", m.options().pad_batch},
          {"metadata", m.metadata()},
          {"compiler_args", m.options().args},
          {"example_inputs", examples},
          {"files", files}};
}

}  // namespace

std::string manifest_checksum(const json& manifest) {
  json rest = manifest;
  rest.erase("checksum");
  const std::string text = rest.dump(1);
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", io::crc32c(text.data(), text.size()));
  return hex;
}

void parallel_model_save(const TensorParallelModel& m, const fs::path& dir) {
  const bool mpi = m.options().backend == "mpi";
  const int me = mpi ? world().rank() : 0;
  if (me == 0) {
    NXD_CHECK(!fs::exists(dir) || (fs::is_directory(dir) && fs::is_empty(dir)),
              "[parallel_model_save] ", dir.string(),
              " exists and is not an empty folder: nothing is overwritten");
    fs::create_directories(dir);
  }
  if (mpi) world().barrier();
  for (size_t i = 0; i < m.ranks().size(); ++i)
    save_rank(m, m.ranks()[i], mpi ? me : static_cast<int>(i), dir);
  if (mpi) world().barrier();
  if (me == 0) {
    json man = manifest(m, dir);
    man["checksum"] = manifest_checksum(man);
    io::write_file_atomic(dir / "manifest.json", man.dump(1));
  }
  if (mpi) world().barrier();
}

}  // namespace nxd::trace

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "nxd/collectives/communicator.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/io/bounded_read.h"
#include "nxd/io/crc32c.h"
#include "nxd/io/safetensors.h"
#include "nxd/trace/mapped_file.h"
#include "nxd/trace/save_load.h"

namespace nxd::trace {

namespace fs = std::filesystem;
using nlohmann::json;

MappedFile::MappedFile(const fs::path& path) {
  int fd = -1;
  try {  // a FIFO or device is refused before anything blocks on it
    fd = io::open_regular_file(path.string(), "trace file", "trace");
  } catch (const IoError& e) {
    throw TraceError(e.what());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw TraceError(str("[trace] cannot stat ", path.string()));
  }
  size_ = st.st_size;
  if (size_ > 0) {
    data_ = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (data_ == MAP_FAILED) {
      data_ = nullptr;
      ::close(fd);
      throw TraceError(str("[trace] cannot map ", path.string(), ": ", std::strerror(errno)));
    }
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, static_cast<size_t>(size_));
}

namespace {

using Files = std::map<std::string, std::shared_ptr<MappedFile>>;

// Maps `name` and checks it against its manifest entry.
std::shared_ptr<MappedFile> open_checked(const fs::path& dir, const std::string& name,
                                         const json& files) {
  const fs::path path = dir / name;
  if (!files.is_object() || !files.contains(name))
    throw TraceError(str("[parallel_model_load] ", path.string(), " is not in the manifest"));
  if (!fs::exists(path))
    throw TraceError(str("[parallel_model_load] ", path.string(), " is missing"));
  auto f = std::make_shared<MappedFile>(path);
  int64_t want = 0;
  std::string crc;
  try {
    const json& e = files.at(name);
    want = e.at("bytes").get<int64_t>();
    crc = e.at("crc32c").get<std::string>();
  } catch (const std::exception& e) {
    throw TraceError(str("[parallel_model_load] ", (dir / "manifest.json").string(),
                         ": bad entry for ", name, ": ", e.what()));
  }
  if (f->size() != want)
    throw TraceError(str("[parallel_model_load] ", path.string(), " has ", f->size(),
                         " bytes, the manifest says ", want, " (truncated or replaced)"));
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", io::crc32c(f->data(), static_cast<size_t>(f->size())));
  if (crc != hex)
    throw TraceError(str("[parallel_model_load] ", path.string(), " is corrupt: CRC-32C ", hex,
                         ", the manifest says ", crc));
  return f;
}

// What a file records of its place against what its name says (a rank's files swapped).
void check_recorded(const std::string& where, const char* key, const std::string& got,
                    const std::string& want) {
  if (got != want)
    throw TraceError(str("[parallel_model_load] ", where, ": records ", key, "=", io::shorten(got),
                         " but its name says ", want,
                         " (a file swapped or copied from another rank or bucket)"));
}

// The safetensors header's metadata value of `key` ("(none)" when absent).
std::string header_field(const io::SafetensorsHeader& h, const char* key) {
  auto it = h.metadata.find(key);
  return it == h.metadata.end() ? std::string("(none)") : it->second;
}

// The tensors of a mapped safetensors file, viewing the mapping (copied only when misaligned);
// the file must record nxd.trace_rank `rank` (and nxd.trace_bucket `bucket` when >= 0).
std::map<std::string, Tensor> tensors_of(const std::shared_ptr<MappedFile>& f,
                                         const std::string& where, int rank, int64_t bucket) {
  std::map<std::string, Tensor> out;
  try {
    if (f->size() < 8) throw io::FileError("shorter than its 8-byte header length");
    uint64_t n = 0;
    std::memcpy(&n, f->data(), 8);
    if (n > static_cast<uint64_t>(f->size() - 8)) throw io::FileError("header past the end");
    io::SafetensorsHeader h =
        io::parse_header(std::string(f->data() + 8, static_cast<size_t>(n)), where);
    check_recorded(where, "nxd.trace_rank", header_field(h, "nxd.trace_rank"), str(rank));
    if (bucket >= 0)
      check_recorded(where, "nxd.trace_bucket", header_field(h, "nxd.trace_bucket"), str(bucket));
    h.data_start = 8 + static_cast<int64_t>(n);
    if (h.data_start + h.data_size > f->size()) throw io::FileError("data past the end");
    for (const io::TensorInfo& t : h.tensors) {
      char* p = f->mutable_data() + h.data_start + t.begin;
      auto impl = std::make_shared<TensorImpl>();
      impl->shape = t.shape;
      impl->strides = contiguous_strides(t.shape);
      impl->dtype = t.dtype;
      impl->storage = Storage::wrap(p, t.nbytes(), [f](void*) {});
      Tensor x(impl);
      if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(dtype_size(t.dtype)) != 0)
        x = x.clone();
      out[t.name] = x;
    }
  } catch (const TraceError&) {
    throw;
  } catch (const std::exception& e) {
    throw TraceError(str("[parallel_model_load] ", where, ": ", e.what()));
  }
  return out;
}

Tensor take(std::map<std::string, Tensor>& m, const std::string& key, const std::string& where) {
  auto it = m.find(key);
  if (it == m.end())
    throw TraceError(str("[parallel_model_load] ", where, " has no tensor '", key, "'"));
  return it->second;
}

struct SavedPlan {
  CompileOptions opts;
  int64_t arena_bytes = 0;
  std::vector<int64_t> offsets;
};

struct RankFiles {
  RankProgram prog;
  std::vector<Graph> graphs;
  std::vector<SavedPlan> plans;
};

RankFiles load_rank(const fs::path& dir, int r, size_t nbuckets, bool inl, const json& files) {
  RankFiles rf;
  const std::string wname = str("rank", r, "/weights.safetensors");
  auto shared = tensors_of(open_checked(dir, wname, files), (dir / wname).string(), r, -1);
  for (const auto& [k, t] : shared)
    if (k.rfind("state:", 0) == 0) rf.prog.state.emplace_back(k.substr(6), t);
  std::map<std::string, Tensor> weights;
  for (size_t b = 0; b < nbuckets; ++b) {
    const std::string gname = str("rank", r, "/bucket", b, ".json");
    const std::string where = (dir / gname).string();
    auto gf = open_checked(dir, gname, files);
    json j;
    try {
      j = json::parse(std::string(gf->data(), static_cast<size_t>(gf->size())));
      check_recorded(where, "rank", j.at("rank").dump(), str(r));
      check_recorded(where, "bucket", j.at("bucket").dump(), str(b));
      const json& c = j.at("compile");
      SavedPlan sp;
      sp.opts.dce = c.at("dce").get<bool>();
      sp.opts.fuse = c.at("fuse").get<bool>();
      sp.opts.plan = c.at("plan").get<bool>();
      sp.arena_bytes = c.at("arena_bytes").get<int64_t>();
      sp.offsets = c.at("offsets").get<std::vector<int64_t>>();
      rf.plans.push_back(std::move(sp));
      rf.graphs.push_back(graph_from_json(j.at("graph").dump(), where));
    } catch (const TraceError&) {
      throw;
    } catch (const std::exception& e) {
      throw TraceError(str("[parallel_model_load] ", where, ": ", e.what()));
    }
    const std::string sname = str("rank", r, "/bucket", b, ".safetensors");
    auto own = tensors_of(open_checked(dir, sname, files), (dir / sname).string(), r,
                          static_cast<int64_t>(b));
    const Graph& g = rf.graphs.back();
    std::vector<Tensor> ps, cs;
    for (int id : g.params) {
      const std::string& name = g.values[id].name;
      Tensor t = inl ? take(own, "param:" + name, (dir / sname).string())
                     : take(shared, "param:" + name, (dir / wname).string());
      if (!inl && !weights.count(name)) {
        weights[name] = t;
        rf.prog.weights.emplace_back(name, t);
      }
      ps.push_back(t);
    }
    for (size_t i = 0; i < g.constants.size(); ++i)
      cs.push_back(take(own, str("const:", i), (dir / sname).string()));
    rf.prog.params.push_back(std::move(ps));
    rf.prog.constants.push_back(std::move(cs));
  }
  return rf;
}

void check_plan(const CompiledGraph& c, const SavedPlan& saved, const std::string& where) {
  if (saved.opts.dce != c.options.dce || saved.opts.fuse != c.options.fuse ||
      saved.opts.plan != c.options.plan)
    throw TraceError(
        str("[parallel_model_load] ", where, ": compiled with other passes than the first graph"));
  if (saved.arena_bytes != c.plan.arena_bytes || saved.offsets != c.plan.offset)
    throw TraceError(
        str("[parallel_model_load] ", where, ": the saved memory plan does not match its graph"));
}

// manifest.json of a saved trace, checked: format, version, checksum, and sizes that make sense.
struct Manifest {
  json doc;  // the manifest as read
  TraceOptions options;
  std::vector<Bucket> buckets;
  std::vector<Tensor> examples;
  std::map<std::string, std::string> metadata;
};

Manifest read_manifest(const fs::path& mpath) {
  Manifest m;
  json& man = m.doc;
  TraceOptions& to = m.options;
  std::vector<Bucket>& buckets = m.buckets;
  std::vector<Tensor>& examples = m.examples;
  try {
    MappedFile mf(mpath);
    const std::string text(mf.data(), static_cast<size_t>(mf.size()));
    try {
      io::check_flow_depth(text, /*yaml=*/false, mpath.string(), "parallel_model_load");
    } catch (const ConfigError& e) {
      throw TraceError(e.what());
    }
    man = json::parse(text);
    if (man.at("format").get<std::string>() != "nxd-trace")
      throw TraceError(str("[parallel_model_load] ", mpath.string(), " is not an nxd trace"));
    const int v = man.at("version").get<int>();
    if (v == 1)
      throw TraceError(str("[parallel_model_load] ", mpath.string(),
                           " has format version 1, saved before traces recorded their ranks and "
                           "the manifest's checksum; this nxd reads version ",
                           kTraceFormatVersion, ": trace the model again (--save-trace)"));
    if (v != kTraceFormatVersion)
      throw TraceError(str("[parallel_model_load] ", mpath.string(), " has format version ", v,
                           "; this nxd reads version ", kTraceFormatVersion));
    const std::string want = man.at("checksum").get<std::string>(), got = manifest_checksum(man);
    if (want != got)
      throw TraceError(str("[parallel_model_load] ", mpath.string(),
                           " was edited or is corrupt: its CRC-32C is ", got,
                           ", its \"checksum\" says ", io::shorten(want)));
    to.tp_degree = man.at("tp_degree").get<int>();
    to.inline_weights = man.at("inline_weights").get<bool>();
    to.pad_batch = man.at("pad_batch").get<bool>();
    m.metadata = man.at("metadata").get<std::map<std::string, std::string>>();
    to.args = man.at("compiler_args").get<std::string>();
    for (const auto& b : man.at("buckets"))
      buckets.push_back({b.at(0).get<int64_t>(), b.at(1).get<int64_t>()});
    for (const auto& e : man.at("example_inputs"))
      examples.push_back(
          zeros(e.at("shape").get<Shape>(), dtype_from_name(e.at("dtype").get<std::string>())));
    man.at("files").items();
  } catch (const TraceError&) {
    throw;
  } catch (const std::exception& e) {
    throw TraceError(str("[parallel_model_load] ", mpath.string(), ": ", e.what()));
  }
  const int tp = to.tp_degree;
  bool bad_bucket = false;
  for (const Bucket& b : buckets) bad_bucket = bad_bucket || b.batch < 1 || b.seq < 1;
  if (tp < 1 || buckets.empty() || examples.empty() || bad_bucket)
    throw TraceError(str("[parallel_model_load] ", mpath.string(), ": tp_degree ", tp, ", ",
                         buckets.size(), " buckets, ", examples.size(), " example inputs"));
  return m;
}

}  // namespace

std::shared_ptr<TensorParallelModel> parallel_model_load(const fs::path& dir,
                                                         const LoadOptions& opts) {
  const fs::path mpath = dir / "manifest.json";
  if (!fs::exists(mpath))
    throw TraceError(
        str("[parallel_model_load] ", mpath.string(), " is missing: not a saved trace"));
  Manifest mf = read_manifest(mpath);
  const json& man = mf.doc;
  TraceOptions& to = mf.options;
  const std::vector<Bucket>& buckets = mf.buckets;
  const std::vector<Tensor>& examples = mf.examples;
  const int tp = to.tp_degree;
  if (opts.expect_tp_degree > 0 && opts.expect_tp_degree != tp)
    throw TraceError(str("[parallel_model_load] ", mpath.string(), " was traced at TP ", tp,
                         ", expected TP ", opts.expect_tp_degree));
  to.backend = opts.backend;
  const bool mpi = opts.backend == "mpi";
  if (mpi && world().size() != tp)
    throw TraceError(str("[parallel_model_load] ", mpath.string(), " was traced at TP ", tp,
                         " but the MPI world has ", world().size(), " processes"));
  std::vector<int> which;
  if (mpi)
    which.push_back(world().rank());
  else
    for (int r = 0; r < (tp == 1 ? 1 : tp); ++r) which.push_back(r);
  std::vector<RankProgram> ranks;
  std::vector<std::vector<Graph>> graphs;
  std::vector<std::vector<SavedPlan>> plans;
  for (int r : which) {
    RankFiles rf = load_rank(dir, r, buckets.size(), to.inline_weights, man.at("files"));
    ranks.push_back(std::move(rf.prog));
    graphs.push_back(std::move(rf.graphs));
    plans.push_back(std::move(rf.plans));
  }
  const CompileOptions co = plans[0][0].opts;
  const int distinct = compile_rank_graphs(graphs, ranks, co, 1);
  for (size_t i = 0; i < ranks.size(); ++i)
    for (size_t b = 0; b < buckets.size(); ++b)
      check_plan(*ranks[i].graphs[b], plans[i][b],
                 (dir / str("rank", which[i], "/bucket", b, ".json")).string());
  if (mpi && !parallel_state::model_parallel_is_initialized())
    parallel_state::initialize_model_parallel(tp);
  auto m = std::make_shared<TensorParallelModel>(to, buckets, std::move(ranks), examples);
  m->set_distinct_compilations(distinct);
  m->metadata() = std::move(mf.metadata);
  return m;
}

}  // namespace nxd::trace

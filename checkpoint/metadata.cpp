#include "nxd/checkpoint/metadata.h"

#include "nxd/checkpoint/error.h"

namespace nxd::ckpt {
using json = nlohmann::json;

namespace {

constexpr int64_t kMaxDegree = int64_t{1} << 20;
constexpr int64_t kMaxElements = int64_t{1} << 50;

struct Checker {
  std::string file;
  [[noreturn]] void bad(const std::string& where, const std::string& what) const {
    throw CheckpointError(str("[checkpoint] ", file, ": ", where, " ", what));
  }
  const json& field(const json& o, const char* key, const std::string& where) const {
    if (!o.contains(key)) bad(where, str("has no \"", key, "\""));
    return o[key];
  }
  int64_t integer(const json& v, int64_t lo, int64_t hi, const std::string& where) const {
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      bad(where, str("must be an integer from ", lo, " to ", hi, ", got ", v.dump()));
    return v.get<int64_t>();
  }
  void type(bool ok, const json& v, const char* what, const std::string& where) const {
    if (!ok) bad(where, str("must be ", what, ", got ", v.dump()));
  }

  // {"dtype", "shape", "pp_rank", "split"?, "dp_rank"?} of one tensor (dp_rank: the EP rank whose
  // files hold an expert's weight, below `ep`).
  void tensor(const json& e, int64_t pp, int64_t ep, const std::string& where) const {
    type(e.is_object(), e, "an object", where);
    const json& dt = field(e, "dtype", where);
    type(dt.is_string() &&
             (dt == "F32" || dt == "BF16" || dt == "F64" || dt == "I32" || dt == "I64"),
         dt, "F32, BF16, F64, I32 or I64", where + " dtype");
    const json& shape = field(e, "shape", where);
    type(shape.is_array(), shape, "an array", where + " shape");
    int64_t n = 1;
    for (const auto& d : shape) {
      const int64_t x = integer(d, 0, kMaxElements, where + " shape");
      if (x != 0 && n > kMaxElements / x) bad(where, str("shape ", shape.dump(), " is too large"));
      n *= x;
    }
    integer(field(e, "pp_rank", where), 0, pp - 1, where + " pp_rank");
    if (e.contains("dp_rank")) integer(e["dp_rank"], 0, ep - 1, where + " dp_rank");
    if (e.contains("split")) split(e["split"], shape, where + " split");
  }

  // A TP split (checkpoint/reshard.h) that the full shape divides into.
  void split(const json& s, const json& shape, const std::string& where) const {
    type(s.is_object(), s, "an object", where);
    const int64_t dim = integer(field(s, "dim", where), 0, 64, where + " dim");
    const int64_t stride = integer(field(s, "stride", where), 1, kMaxDegree, where + " stride");
    const int64_t parts = integer(field(s, "parts", where), 1, kMaxDegree, where + " parts");
    const int64_t rep = integer(field(s, "replicas", where), 1, parts, where + " replicas");
    if (parts % rep != 0) bad(where, str("parts ", parts, " are not a multiple of replicas ", rep));
    if (dim >= static_cast<int64_t>(shape.size()))
      bad(where, str("dim ", dim, " is not a dim of shape ", shape.dump()));
    const int64_t n = shape[static_cast<size_t>(dim)].get<int64_t>();
    if (n % (stride * (parts / rep)) != 0)
      bad(where, str("size ", n, " of dim ", dim, " does not split into ", parts / rep,
                     " blocks x stride ", stride));
  }

  void table(const json& t, int64_t pp, int64_t ep, const std::string& where) const {
    type(t.is_object(), t, "an object", where);
    for (const auto& [name, e] : t.items()) tensor(e, pp, ep, str(where, " tensor '", name, "'"));
  }

  void optimizer_info(const json& info, const std::string& where) const {
    type(info.is_object(), info, "an object", where);
    type(field(info, "kind", where).is_string(), info["kind"], "a string", where + " kind");
    integer(field(info, "steps", where), 0, int64_t{1} << 62, where + " steps");
    if (info.contains("options"))
      type(info["options"].is_object(), info["options"], "an object", where + " options");
    const json& groups = field(info, "groups", where);
    type(groups.is_array(), groups, "an array", where + " groups");
    for (size_t i = 0; i < groups.size(); ++i) {
      const json& g = groups[i];
      const std::string w = str(where, " group ", i);
      type(g.is_object(), g, "an object", w);
      type(field(g, "name", w).is_string(), g["name"], "a string", w + " name");
      for (const char* k : {"lr", "weight_decay", "lr_scale"})
        type(field(g, k, w).is_number(), g[k], "a number", str(w, " ", k));
      const json& ps = field(g, "params", w);
      type(ps.is_array(), ps, "an array", w + " params");
      for (const auto& p : ps) type(p.is_string(), p, "a string", w + " params");
    }
  }

  void files(const json& f) const {
    type(f.is_object(), f, "an object", "files");
    for (const auto& [rel, info] : f.items()) {
      const std::string where = str("files entry '", rel, "'");
      if (rel.empty() || rel.front() == '/' || rel.find("..") != std::string::npos)
        bad(where, "is not a path inside the checkpoint");
      type(info.is_object(), info, "an object", where);
      integer(field(info, "bytes", where), 0, int64_t{1} << 62, where + " bytes");
      if (info.contains("tensors"))
        integer(info["tensors"], 0, int64_t{1} << 40, where + " tensors");
    }
  }
};

}  // namespace

json parse_metadata(const std::string& text, const std::string& file) {
  json m;
  try {
    m = json::parse(text);
  } catch (const std::exception& e) {
    throw CheckpointError(str("[checkpoint] ", file, " is not valid JSON: ", e.what()));
  }
  const Checker c{file};
  if (!m.is_object() || !m.contains("format") || m["format"] != "nxd-checkpoint" ||
      !m.contains("format_version") || !m["format_version"].is_number_integer())
    throw CheckpointError(str("[checkpoint] ", file, " is not nxd checkpoint metadata"));
  const int64_t v = m["format_version"].get<int64_t>();
  if (v > kFormatVersion)
    throw CheckpointError(str("[checkpoint] ", file, " has format_version ", v,
                              ", newer than this nxd's ", kFormatVersion, " (written by nxd ",
                              m.contains("nxd_version") && m["nxd_version"].is_string()
                                  ? m["nxd_version"].get<std::string>()
                                  : std::string("?"),
                              "): upgrade nxd to load it"));
  c.integer(m["format_version"], 1, kFormatVersion, "format_version");
  for (const char* k : {"tag", "nxd_version"})
    if (m.contains(k)) c.type(m[k].is_string(), m[k], "a string", k);
  if (m.contains("step")) c.integer(m["step"], 0, int64_t{1} << 62, "step");
  if (m.contains("compressed"))
    c.type(m["compressed"].is_boolean(), m["compressed"], "a boolean", "compressed");
  if (m.contains("model_config"))
    c.type(m["model_config"].is_object(), m["model_config"], "an object", "model_config");
  const json& par = c.field(m, "parallel", "metadata");
  c.type(par.is_object(), par, "an object", "parallel");
  int64_t deg[4];
  const char* names[4] = {"world", "tp", "pp", "dp"};
  for (int i = 0; i < 4; ++i)
    deg[i] =
        c.integer(c.field(par, names[i], "parallel"), 1, kMaxDegree, str("parallel ", names[i]));
  if (deg[0] != deg[1] * deg[2] * deg[3])
    c.bad("parallel",
          str("world ", deg[0], " is not tp x pp x dp = ", deg[1], " x ", deg[2], " x ", deg[3]));
  if (par.contains("zero1")) {
    c.type(par["zero1"].is_boolean(), par["zero1"], "a boolean", "parallel zero1");
    if (par["zero1"].get<bool>() && v < 2) c.bad("parallel zero1", "needs format_version 2");
  }
  if (par.contains("zero3")) {
    c.type(par["zero3"].is_boolean(), par["zero3"], "a boolean", "parallel zero3");
    if (par["zero3"].get<bool>() && v < 3) c.bad("parallel zero3", "needs format_version 3");
  }
  int64_t ep = 1;
  if (m.contains("expert_parallel")) {
    ep = c.integer(m["expert_parallel"], 1, deg[3], "expert_parallel");
    if (deg[3] % ep != 0) c.bad("expert_parallel", str(ep, " does not divide dp ", deg[3]));
  }
  c.files(c.field(m, "files", "metadata"));
  if (m.contains("model")) c.table(m["model"], deg[2], ep, "model");
  if (m.contains("optimizer")) {
    const json& o = m["optimizer"];
    c.type(o.is_object(), o, "an object", "optimizer");
    c.optimizer_info(c.field(o, "info", "optimizer"), "optimizer info");
    c.table(c.field(o, "tensors", "optimizer"), deg[2], ep, "optimizer");
  }
  return m;
}

SavedLayout saved_layout(const json& meta) {
  const json& par = meta.at("parallel");
  SavedLayout s;
  s.world = par.at("world").get<int>();
  s.tp = par.at("tp").get<int>();
  s.pp = par.at("pp").get<int>();
  s.dp = par.at("dp").get<int>();
  s.ep = meta.value("expert_parallel", 1);
  s.zero1 = par.value("zero1", false);
  s.zero3 = par.value("zero3", false);
  s.compressed = meta.value("compressed", false);
  return s;
}

}  // namespace nxd::ckpt

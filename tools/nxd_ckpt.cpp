// nxd-ckpt: look at, check and convert nxd checkpoints without a training job.
//   inspect DIR               the checkpoints under DIR (or DIR itself): complete or not, step,
//                             degrees (zero1: optimizer state in per-DP-rank files); with
//                             --tensors every tensor's dtype, full shape, bytes, split
//   verify DIR                every file and checksum of DIR's newest complete checkpoint (or DIR);
//                             exit 1 at the first bad one, naming it
//   export DIR OUT            the model as one safetensors file of full tensors
//   reshard DIR --tp N [--pp N] [--dp N] --out DIR2
//                             the checkpoint at other degrees (CausalLM checkpoints; ZeRO-1
//                             state is written per DP rank of the new DP degree)
//   import FILE OUT [--tp N] [--dp N] [--tag T]
//                             an exported file back into a checkpoint OUT/T (model only)
//   export-hf DIR OUT_DIR     model.safetensors + config.json for Hugging Face transformers
//   import-hf HF_DIR OUT [--tp N] [--dp N] [--tag T]
//                             a transformers folder (Llama, GPT-NeoX) into a checkpoint OUT/T
// import and import-hf also take OUT as --out OUT (the earlier form); --tp and --dp default to 1,
// --tag to "imported".
// Exit codes: 0 ok, 1 verify found damage (or an internal error), 2 a user mistake.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/offline.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const char* kUsage =
    "usage: nxd-ckpt inspect DIR [--tensors]\n"
    "       nxd-ckpt verify DIR\n"
    "       nxd-ckpt export DIR OUT.safetensors\n"
    "       nxd-ckpt reshard DIR --tp N [--pp N] [--dp N] --out DIR2\n"
    "       nxd-ckpt import FILE.safetensors OUT [--tp N] [--dp N] [--tag T]\n"
    "       nxd-ckpt export-hf DIR OUT_DIR\n"
    "       nxd-ckpt import-hf HF_DIR OUT [--tp N] [--dp N] [--tag T]\n"
    "DIR is a checkpoint folder (<path>/<tag>) or a folder of checkpoints (its newest complete "
    "one)\n";

struct Usage : nxd::UserError {
  using UserError::UserError;
};

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n') c = ' ';
  return s;
}

int to_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || x < 1 || x > 1 << 20)
    throw Usage(nxd::str(flag, " needs a positive integer, got '", v, "'"));
  return static_cast<int>(x);
}

void print_tag(const fs::path& dir, bool tensors) {
  const json m = nxd::ckpt::read_metadata(dir);
  const auto& p = m["parallel"];
  std::printf("%s: complete, step %lld, tp %d pp %d dp %d%s, format %d (nxd %s)%s\n",
              dir.string().c_str(), static_cast<long long>(m.value("step", int64_t{0})),
              p.value("tp", 1), p.value("pp", 1), p.value("dp", 1),
              p.value("zero1", false) ? " zero1" : "", m["format_version"].get<int>(),
              m.value("nxd_version", "?").c_str(), m.value("compressed", false) ? ", zstd" : "");
  if (m.contains("model_config"))
    std::printf("  model_config %s\n", m["model_config"].dump().c_str());
  if (m.contains("optimizer") && m["optimizer"].contains("info"))
    std::printf("  optimizer %s, %lld steps\n", m["optimizer"]["info"].value("kind", "?").c_str(),
                static_cast<long long>(m["optimizer"]["info"].value("steps", int64_t{0})));
  if (!tensors) return;
  for (const char* kind : {"model", "optimizer"}) {
    const json* t = nullptr;
    if (m.contains(kind)) t = std::strcmp(kind, "model") == 0 ? &m[kind] : &m[kind]["tensors"];
    if (!t) continue;
    for (const auto& [name, e] : t->items()) {
      int64_t n = 1;
      for (const auto& d : e["shape"]) n *= d.get<int64_t>();
      const std::string dt = e["dtype"];
      const int64_t size = dt == "BF16" ? 2 : (dt == "F32" || dt == "I32") ? 4 : 8;
      std::printf("  %s %s %s %s %lld bytes%s\n", kind, name.c_str(), dt.c_str(),
                  e["shape"].dump().c_str(), static_cast<long long>(n * size),
                  e.contains("split") ? (" split " + e["split"].dump()).c_str() : "");
    }
  }
}

int inspect(const fs::path& dir, bool tensors) {
  if (!fs::is_directory(dir)) throw Usage(nxd::str(dir.string(), " is not a folder"));
  if (fs::exists(dir / "checkpoint")) {
    print_tag(dir, tensors);
    return 0;
  }
  const auto tags = nxd::ckpt::list_checkpoints(dir);
  if (tags.empty()) throw Usage(nxd::str("no checkpoints under ", dir.string()));
  for (const auto& t : tags) {
    if (t.complete)
      print_tag(dir / t.tag, tensors);
    else
      std::printf("%s: incomplete (no done marker; not loadable)\n",
                  (dir / t.tag).string().c_str());
  }
  return 0;
}

int verify(const fs::path& dir) {
  const fs::path tag = nxd::ckpt::resolve_checkpoint(dir);
  try {
    const auto r = nxd::ckpt::verify_checkpoint(tag);
    std::printf("%s: ok, %lld files, %lld tensors, %lld bytes verified\n", tag.string().c_str(),
                static_cast<long long>(r.files), static_cast<long long>(r.tensors),
                static_cast<long long>(r.bytes));
    return 0;
  } catch (const nxd::ckpt::CheckpointError& e) {
    std::fprintf(stderr, "nxd-ckpt: verify failed: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}

int run(const std::vector<std::string>& a) {
  if (a.empty() || a[0] == "--help" || a[0] == "-h") {
    std::fputs(kUsage, a.empty() ? stderr : stdout);
    return a.empty() ? 2 : 0;
  }
  const std::string cmd = a[0];
  std::vector<std::string> pos;
  std::string out, tag_name = "imported";
  int tp = 0, dp = 1, pp = 1;
  bool tp_given = false;
  bool tensors = false;
  for (size_t i = 1; i < a.size(); ++i) {
    auto value = [&]() -> const std::string& {
      if (i + 1 >= a.size()) throw Usage(a[i] + " needs a value");
      return a[++i];
    };
    if (a[i] == "--tensors")
      tensors = true;
    else if (a[i] == "--out")
      out = value();
    else if (a[i] == "--tp")
      tp = to_int("--tp", value()), tp_given = true;
    else if (a[i] == "--tag")
      tag_name = value();
    else if (a[i] == "--dp")
      dp = to_int("--dp", value());
    else if (a[i] == "--pp")
      pp = to_int("--pp", value());
    else if (a[i].rfind("--", 0) == 0)
      throw Usage("unknown option " + a[i]);
    else
      pos.push_back(a[i]);
  }
  auto want = [&](size_t n) {
    if (pos.size() != n) throw Usage(nxd::str(cmd, " takes ", n, " argument(s), got ", pos.size()));
  };
  if (cmd == "inspect") {
    want(1);
    return inspect(pos[0], tensors);
  }
  if (cmd == "verify") {
    want(1);
    return verify(pos[0]);
  }
  if (cmd == "export") {
    want(2);
    const fs::path tag = nxd::ckpt::resolve_checkpoint(pos[0]);
    nxd::ckpt::export_merged(tag, pos[1]);
    std::printf("%s -> %s\n", tag.string().c_str(), pos[1].c_str());
    return 0;
  }
  if (cmd == "reshard") {
    want(1);
    if (tp == 0 || out.empty()) throw Usage("reshard needs --tp N and --out DIR");
    const fs::path tag = nxd::ckpt::resolve_checkpoint(pos[0]);
    if (fs::exists(fs::path(out) / tag.filename()))
      throw Usage(nxd::str((fs::path(out) / tag.filename()).string(), " already exists"));
    nxd::ckpt::reshard_checkpoint(tag, out, tp, dp, pp);
    std::printf("%s -> %s (tp %d pp %d dp %d)\n", tag.string().c_str(),
                (fs::path(out) / tag.filename()).string().c_str(), tp, pp, dp);
    return 0;
  }
  // import FILE OUT / import-hf HF_DIR OUT (or OUT as --out)
  auto import_target = [&](const char* src) {
    if (pos.size() == 2 && !out.empty())
      throw Usage(nxd::str(cmd, " got OUT twice: '", pos[1], "' and --out '", out, "'"));
    if (pos.size() == 2) out = pos[1];
    if (pos.size() < 1 || pos.size() > 2 || out.empty())
      throw Usage(nxd::str(cmd, " takes ", src, " OUT, got ", pos.size(), " argument(s)"));
    if (!tp_given) tp = 1;
    if (tag_name.empty() || tag_name == "." || tag_name == ".." ||
        tag_name.find('/') != std::string::npos)
      throw Usage(nxd::str("--tag must be a plain folder name, got '", tag_name, "'"));
    if (fs::exists(fs::path(out) / tag_name))
      throw Usage(nxd::str((fs::path(out) / tag_name).string(), " already exists"));
  };
  if (cmd == "import") {
    import_target("FILE");
    if (!fs::is_regular_file(pos[0])) throw Usage(nxd::str(pos[0], " is not a file"));
    nxd::ckpt::import_merged(pos[0], out, tag_name, tp, dp);
    std::printf("%s -> %s (tp %d dp %d)\n", pos[0].c_str(),
                (fs::path(out) / tag_name).string().c_str(), tp, dp);
    return 0;
  }
  if (cmd == "export-hf") {
    want(2);
    const fs::path tag = nxd::ckpt::resolve_checkpoint(pos[0]);
    nxd::ckpt::export_hf(tag, pos[1]);
    std::printf("%s -> %s/{model.safetensors,config.json}\n", tag.string().c_str(), pos[1].c_str());
    return 0;
  }
  if (cmd == "import-hf") {
    import_target("HF_DIR");
    if (!fs::is_regular_file(fs::path(pos[0]) / "config.json"))
      throw Usage(nxd::str(pos[0], " has no config.json"));
    if (!fs::is_regular_file(fs::path(pos[0]) / "model.safetensors"))
      throw Usage(nxd::str(pos[0], " has no model.safetensors"));
    nxd::ckpt::import_hf(pos[0], out, tag_name, tp, dp);
    std::printf("%s -> %s (tp %d dp %d)\n", pos[0].c_str(),
                (fs::path(out) / tag_name).string().c_str(), tp, dp);
    return 0;
  }
  throw Usage("unknown command '" + cmd + "'");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const Usage& e) {
    std::fprintf(stderr, "nxd-ckpt: error: %s\n%s", one_line(e.what()).c_str(), kUsage);
    return 2;
  } catch (const nxd::UserError& e) {
    std::fprintf(stderr, "nxd-ckpt: error: %s\n", one_line(e.what()).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nxd-ckpt: internal error: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}

// nxd-ckpt: look at, check and convert nxd checkpoints without a training job.
//   inspect DIR               the checkpoints under DIR (or DIR itself): complete or not, step,
//                             degrees (zero1: optimizer state in per-DP-rank files; zero3: the
//                             model in per-DP-rank blocks; a MoE model:
//                             its expert-parallel degree and experts per EP rank); with
//                             --tensors every tensor's dtype, full shape, bytes, split, dp_rank
//   verify DIR                every file and checksum of DIR's newest complete checkpoint (or DIR),
//                             every listed tensor in its files, every MoE expert exactly once
//                             (in its EP rank's files); exit 1 at the first bad one, naming it
//   export DIR OUT            the model as one safetensors file of full tensors
//   reshard DIR --tp N [--pp N] [--dp N] [--ep N] --out DIR2
//                             the checkpoint at other degrees (CausalLM checkpoints; ZeRO-1
//                             state is written per DP rank of the new DP degree; --ep: the
//                             expert-parallel degree of a MoE model, dividing --dp, default 1)
//   import FILE OUT [--tp N] [--dp N] [--tag T]
//                             an exported file back into a checkpoint OUT/T (model only)
//   export-hf DIR OUT_DIR [--merge-lora]
//                             model.safetensors + config.json for Hugging Face transformers
//                             (export and export-hf also take a run folder: its checkpoints/);
//                             a LoRA checkpoint's adapters merged into the base weights
//   export-lora DIR OUT_DIR   a LoRA checkpoint's adapters alone, in PEFT's layout
//                             (adapter_config.json + adapter_model.safetensors)
//   import-hf HF_DIR OUT [--tp N] [--dp N] [--tag T]
//                             a transformers folder (Llama, GPT-NeoX) into a checkpoint OUT/T
//   export-gguf DIR OUT.gguf [--type f32|f16|bf16|q8_0|q4_0] [--tokenizer tokenizer.json]
//                             a Llama model as a GGUF file for llama.cpp (checkpoint/gguf_llama.h)
//   import-gguf FILE OUT [--tp N] [--dp N] [--tag T]
//                             a Llama GGUF file (f32, f16, bf16, q8_0, q4_0 tensors) into a
//                             checkpoint OUT/T (weights dequantized to f32)
//   quantize DIR OUT --format int8|int4[:32|:64|:128][:asym][:head[=int8|int4]]
//                             the decoder's linear layers (and with :head the output head)
//                             quantized once into
//                             OUT/quantized.safetensors (checkpoint/quantized.h), for
//                             nxd-generate / nxd-serve --checkpoint OUT; OUT new or empty.
//                             inspect and verify take OUT too (verify: everything the loader
//                             checks)
// import and import-hf also take OUT as --out OUT (the earlier form); --tp and --dp default to 1,
// --tag to "imported".
// Exit codes: 0 ok, 1 verify found damage (or an internal error), 2 a user mistake.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/gguf_llama.h"
#include "nxd/checkpoint/lora_files.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/checkpoint/quantized.h"
#include "nxd/cli/exit.h"
#include "nxd/io/bounded_read.h"
#include "nxd/io/env_check.h"
#include "nxd/io/safetensors.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
void refuse_to_overwrite(const std::string& cmd, const fs::path& out);

const char* kUsage =
    "usage: nxd-ckpt inspect DIR [--tensors]\n"
    "       nxd-ckpt verify DIR\n"
    "       nxd-ckpt export DIR OUT.safetensors\n"
    "       nxd-ckpt reshard DIR --tp N [--pp N] [--dp N] [--ep N] --out DIR2\n"
    "       nxd-ckpt import FILE.safetensors OUT [--tp N] [--dp N] [--tag T]\n"
    "       nxd-ckpt export-hf DIR OUT_DIR [--merge-lora]\n"
    "       nxd-ckpt export-lora DIR OUT_DIR\n"
    "       nxd-ckpt import-hf HF_DIR OUT [--tp N] [--dp N] [--tag T]\n"
    "       nxd-ckpt export-gguf DIR OUT.gguf [--type f32|f16|bf16|q8_0|q4_0] [--tokenizer F]\n"
    "       nxd-ckpt import-gguf FILE.gguf OUT [--tp N] [--dp N] [--tag T]\n"
    "       nxd-ckpt quantize DIR OUT --format int8|int4[:32|:64|:128][:asym][:head[=int8|int4]]\n"
    "DIR is a checkpoint folder (<path>/<tag>) or a folder of checkpoints (its newest complete "
    "one); export and export-hf also take a run folder (its checkpoints/)\n";

struct Usage : nxd::UserError {
  using UserError::UserError;
};

int to_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || x < 1 || x > 1 << 20)
    throw Usage(nxd::str(flag, " needs a positive integer, got '", v, "'"));
  return static_cast<int>(x);
}

// A MoE model's experts: how many, over which expert-parallel degree, in which files.
void print_experts(const json& m) {
  if (!m.contains("model_config") || !m["model_config"].contains("moe")) return;
  const int64_t e = m["model_config"]["moe"].value("num_experts", int64_t{0});
  const int ep = nxd::ckpt::saved_layout(m).ep;
  if (e <= 0) return;
  if (ep <= 1) {
    std::printf("  experts %lld per MoE layer, expert parallel 1 (all in the DP rank 0 files)\n",
                static_cast<long long>(e));
    return;
  }
  std::printf(
      "  experts %lld per MoE layer, expert parallel %d: %lld per EP rank (EP rank r's in the "
      "files of DP rank r)\n",
      static_cast<long long>(e), ep, static_cast<long long>(e / ep));
}

void print_tag(const fs::path& dir, bool tensors) {
  const json m = nxd::ckpt::read_metadata(dir);
  const nxd::ckpt::SavedLayout p = nxd::ckpt::saved_layout(m);
  const bool moe = m.contains("model_config") && m["model_config"].contains("moe");
  std::printf("%s: complete, step %lld, tp %d pp %d dp %d%s%s%s, format %d (nxd %s)%s\n",
              dir.string().c_str(), static_cast<long long>(m.value("step", int64_t{0})), p.tp, p.pp,
              p.dp, moe ? nxd::str(" ep ", p.ep).c_str() : "", p.zero1 ? " zero1" : "",
              p.zero3 ? " zero3" : "", m["format_version"].get<int>(),
              m.value("nxd_version", "?").c_str(), p.compressed ? ", zstd" : "");
  if (m.contains("model_config"))
    std::printf("  model_config %s\n", m["model_config"].dump().c_str());
  print_experts(m);
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
      std::printf("  %s %s %s %s %lld bytes%s%s\n", kind, name.c_str(), dt.c_str(),
                  e["shape"].dump().c_str(), static_cast<long long>(n * size),
                  e.contains("split") ? (" split " + e["split"].dump()).c_str() : "",
                  e.contains("dp_rank") ? nxd::str(" dp_rank ", e["dp_rank"].dump()).c_str() : "");
    }
  }
}

// A quantized checkpoint (nxd-ckpt quantize): its format, layers and model.
int inspect_quantized(const fs::path& dir, bool tensors) {
  const nxd::ckpt::QuantizedCheckpoint q = nxd::ckpt::read_quantized_checkpoint(dir);
  std::printf(
      "%s: quantized checkpoint (layout %d), %s weights in %zu linear layers, %zu tensors\n",
      q.file.string().c_str(), q.layout, nxd::describe(q.opts).c_str(), q.layers.size(),
      q.tensors.size());
  std::printf("  model_config %s\n", nxd::ckpt::model_config_json(q.cfg).dump().c_str());
  if (tensors)
    for (const auto& [name, t] : q.tensors)
      std::printf("  %s %s %s %lld bytes\n", name.c_str(), nxd::io::safetensors_dtype(t.dtype()),
                  nxd::shape_str(t.shape()).c_str(),
                  static_cast<long long>(t.numel() * nxd::dtype_size(t.dtype())));
  return 0;
}

int inspect(const fs::path& dir, bool tensors) {
  if (!fs::is_directory(dir)) throw Usage(nxd::str(dir.string(), " is not a folder"));
  if (nxd::ckpt::is_quantized_checkpoint(dir)) return inspect_quantized(dir, tensors);
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
  if (nxd::ckpt::is_quantized_checkpoint(dir)) try {
      const auto r = nxd::ckpt::verify_quantized_checkpoint(dir);
      std::printf("%s: ok, quantized %s, %lld layers, %lld tensors, %lld bytes verified\n",
                  (dir / nxd::ckpt::kQuantizedFile).string().c_str(), r.format.c_str(),
                  static_cast<long long>(r.layers), static_cast<long long>(r.tensors),
                  static_cast<long long>(r.bytes));
      return 0;
    } catch (const nxd::UserError& e) {  // damage: a file or a key the loader would refuse
      std::fprintf(stderr, "nxd-ckpt: verify failed: %s\n", nxd::io::one_line(e.what()).c_str());
      return 1;
    }
  const fs::path tag = nxd::ckpt::resolve_checkpoint(dir);
  try {
    const auto r = nxd::ckpt::verify_checkpoint(tag);
    std::printf("%s: ok, %lld files, %lld tensors, %lld bytes verified\n", tag.string().c_str(),
                static_cast<long long>(r.files), static_cast<long long>(r.tensors),
                static_cast<long long>(r.bytes));
    return 0;
  } catch (const nxd::ckpt::CheckpointError& e) {
    std::fprintf(stderr, "nxd-ckpt: verify failed: %s\n", nxd::io::one_line(e.what()).c_str());
    return 1;
  }
}

// A checkpoint, a folder of checkpoints (its newest complete one) or a run folder (the newest
// complete checkpoint in its checkpoints/, said so).
fs::path resolve_export_source(const fs::path& dir) {
  if (fs::is_directory(dir) && !fs::exists(dir / "checkpoint") && !nxd::ckpt::has_checkpoint(dir)) {
    if (nxd::ckpt::has_checkpoint(dir / "checkpoints")) {
      const fs::path tag = nxd::ckpt::resolve_checkpoint(dir / "checkpoints");
      std::printf("%s is a run folder: exporting its newest complete checkpoint %s\n",
                  dir.string().c_str(), tag.string().c_str());
      return tag;
    }
    throw Usage(nxd::str(dir.string(),
                         " is neither a checkpoint, a folder of complete checkpoints, nor a run "
                         "folder with complete checkpoints in checkpoints/"));
  }
  return nxd::ckpt::resolve_checkpoint(dir);
}

// The command line after the command name.
struct Args {
  std::string cmd;
  std::vector<std::string> pos;  // positional arguments
  std::string out, tag = "imported";
  int tp = 0, dp = 1, pp = 1, ep = 1;  // tp 0: not given
  bool tensors = false;
  bool merge_lora = false;      // export-hf: merge a LoRA checkpoint's adapters
  std::string type, tokenizer;  // export-gguf
  std::string format;           // quantize
  void want(size_t n) const {
    if (pos.size() != n) throw Usage(nxd::str(cmd, " takes ", n, " argument(s), got ", pos.size()));
  }
};

Args parse(const std::vector<std::string>& a) {
  Args r;
  r.cmd = a[0];
  for (size_t i = 1; i < a.size(); ++i) {
    auto value = [&]() -> const std::string& {
      if (i + 1 >= a.size()) throw Usage(a[i] + " needs a value");
      return a[++i];
    };
    if (a[i] == "--tensors")
      r.tensors = true;
    else if (a[i] == "--merge-lora")
      r.merge_lora = true;
    else if (a[i] == "--out")
      r.out = value();
    else if (a[i] == "--type")
      r.type = value();
    else if (a[i] == "--format")
      r.format = value();
    else if (a[i] == "--tokenizer")
      r.tokenizer = value();
    else if (a[i] == "--tp")
      r.tp = to_int("--tp", value());
    else if (a[i] == "--tag")
      r.tag = value();
    else if (a[i] == "--dp")
      r.dp = to_int("--dp", value());
    else if (a[i] == "--pp")
      r.pp = to_int("--pp", value());
    else if (a[i] == "--ep")
      r.ep = to_int("--ep", value());
    else if (a[i].rfind("--", 0) == 0)
      throw Usage("unknown option " + a[i]);
    else
      r.pos.push_back(a[i]);
  }
  return r;
}

int reshard(const Args& a) {
  a.want(1);
  if (a.tp == 0 || a.out.empty()) throw Usage("reshard needs --tp N and --out DIR");
  const fs::path tag = nxd::ckpt::resolve_checkpoint(a.pos[0]);
  const fs::path dst = fs::path(a.out) / tag.filename();
  if (fs::exists(dst)) throw Usage(nxd::str(dst.string(), " already exists"));
  nxd::ckpt::reshard_checkpoint(tag, a.out, {.tp = a.tp, .pp = a.pp, .dp = a.dp, .ep = a.ep});
  std::printf("%s -> %s (tp %d pp %d dp %d%s)\n", tag.string().c_str(), dst.string().c_str(), a.tp,
              a.pp, a.dp, a.ep > 1 ? nxd::str(" ep ", a.ep).c_str() : "");
  return 0;
}

// export-gguf DIR OUT.gguf: the model as a GGUF file (never over an existing file).
int export_gguf(const Args& a) {
  a.want(2);
  const fs::path tag = resolve_export_source(a.pos[0]);
  nxd::ckpt::GgufExportOptions o;
  try {
    if (!a.type.empty()) o.type = nxd::io::ggml_type_from_name(a.type);
  } catch (const nxd::ConfigError& e) {
    throw Usage(nxd::str("--type: ", e.what()));
  }
  o.tokenizer = a.tokenizer;
  const auto r = nxd::ckpt::export_gguf(tag, a.pos[1], o);
  std::printf("%s -> %s (%s, %lld tensors, %.2f MB%s%s)\n", tag.string().c_str(), a.pos[1].c_str(),
              nxd::io::ggml_type_name(static_cast<uint32_t>(o.type)), (long long)r.tensors,
              r.bytes / 1e6,
              r.kept_f16 ? nxd::str(", ", r.kept_f16,
                                    " matrices kept f16 (rows not a multiple of "
                                    "32)")
                               .c_str()
                         : "",
              r.has_tokenizer ? ", with the tokenizer"
                              : ", no tokenizer (llama.cpp needs one: --tokenizer)");
  return 0;
}

// quantize DIR OUT --format F: the model's decoder linear layers quantized once, into
// OUT/quantized.safetensors (checkpoint/quantized.h); OUT must be new or an empty folder.
int quantize(const Args& a) {
  a.want(2);
  if (a.format.empty()) throw Usage("quantize needs --format int8|int4[:G][:asym][:head]");
  nxd::QuantizeOptions o;
  try {
    o = nxd::parse_weight_quant(a.format);
  } catch (const nxd::ConfigError& e) {
    throw Usage(nxd::str("--format: ", e.what()));
  }
  const fs::path tag = resolve_export_source(a.pos[0]);
  const auto r = nxd::ckpt::quantize_checkpoint(tag, a.pos[1], o);
  std::printf(
      "%s -> %s (%s weights in %lld linear layers, %.2f MB -> %.2f MB; %lld tensors, %.2f "
      "MB file)\n",
      tag.string().c_str(), (fs::path(a.pos[1]) / nxd::ckpt::kQuantizedFile).string().c_str(),
      nxd::describe(o).c_str(), static_cast<long long>(r.summary.layers),
      r.summary.bytes_before / 1e6, r.summary.bytes_after / 1e6, static_cast<long long>(r.tensors),
      r.file_bytes / 1e6);
  if (r.head.layers > 0)
    std::printf("output head: %s, %.2f MB -> %.2f MB\n", nxd::weight_quant_name(o.head),
                r.head.bytes_before / 1e6, r.head.bytes_after / 1e6);
  return 0;
}

// import FILE OUT / import-hf HF_DIR OUT / import-gguf FILE OUT (OUT also as --out OUT), at
// --tp / --dp (default 1).
int import(Args a) {
  const bool hf = a.cmd == "import-hf";
  if (a.pos.size() == 2 && !a.out.empty())
    throw Usage(nxd::str(a.cmd, " got OUT twice: '", a.pos[1], "' and --out '", a.out, "'"));
  if (a.pos.size() == 2) a.out = a.pos[1];
  if (a.pos.size() < 1 || a.pos.size() > 2 || a.out.empty())
    throw Usage(nxd::str(a.cmd, " takes ", hf ? "HF_DIR" : "FILE", " OUT, got ", a.pos.size(),
                         " argument(s)"));
  if (a.tp == 0) a.tp = 1;
  if (a.tag.empty() || a.tag == "." || a.tag == ".." || a.tag.find('/') != std::string::npos)
    throw Usage(nxd::str("--tag must be a plain folder name, got '", a.tag, "'"));
  const fs::path src = a.pos[0], dst = fs::path(a.out) / a.tag;
  if (fs::exists(dst)) throw Usage(nxd::str(dst.string(), " already exists"));
  if (a.cmd == "import-gguf") {
    if (!fs::is_regular_file(src)) throw Usage(nxd::str(src.string(), " is not a file"));
    nxd::ckpt::import_gguf(src, a.out, a.tag, a.tp, a.dp);
  } else if (!hf) {
    if (!fs::is_regular_file(src)) throw Usage(nxd::str(src.string(), " is not a file"));
    nxd::ckpt::import_merged(src, a.out, a.tag, a.tp, a.dp);
  } else {
    if (!fs::is_regular_file(src / "config.json"))
      throw Usage(nxd::str(src.string(), " has no config.json"));
    if (!fs::is_regular_file(src / "model.safetensors") &&
        !fs::is_regular_file(src / "model.safetensors.index.json"))
      throw Usage(nxd::str(src.string(),
                           " has neither model.safetensors nor model.safetensors.index.json"));
    nxd::ckpt::import_hf(src, a.out, a.tag, a.tp, a.dp);
  }
  std::printf("%s -> %s (tp %d dp %d)\n", src.string().c_str(), dst.string().c_str(), a.tp, a.dp);
  return 0;
}

int run(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {
    std::fputs(kUsage, argv.empty() ? stderr : stdout);
    return argv.empty() ? 2 : 0;
  }
  const Args a = parse(argv);
  nxd::io::check_environment();  // NXD_* variables, as nxd-train checks them
  if (a.cmd == "inspect") {
    a.want(1);
    return inspect(a.pos[0], a.tensors);
  }
  if (a.cmd == "verify") {
    a.want(1);
    return verify(a.pos[0]);
  }
  if (a.merge_lora && a.cmd != "export-hf") throw Usage("--merge-lora is an option of export-hf");
  if ((!a.type.empty() || !a.tokenizer.empty()) && a.cmd != "export-gguf")
    throw Usage("--type and --tokenizer are options of export-gguf");
  if (!a.format.empty() && a.cmd != "quantize") throw Usage("--format is an option of quantize");
  if (a.cmd == "export-gguf") return export_gguf(a);
  if (a.cmd == "quantize") return quantize(a);
  if (a.cmd == "export-lora") {
    a.want(2);
    const fs::path tag = resolve_export_source(a.pos[0]);
    refuse_to_overwrite(a.cmd, a.pos[1]);
    nxd::ckpt::export_lora(tag, a.pos[1]);
    std::printf("%s -> %s/{adapter_config.json,adapter_model.safetensors}\n", tag.string().c_str(),
                a.pos[1].c_str());
    return 0;
  }
  if (a.cmd == "export" || a.cmd == "export-hf") {
    a.want(2);
    const fs::path tag = resolve_export_source(a.pos[0]);
    refuse_to_overwrite(a.cmd, a.pos[1]);
    if (a.cmd == "export") {
      nxd::ckpt::export_merged(tag, a.pos[1]);
      std::printf("%s -> %s\n", tag.string().c_str(), a.pos[1].c_str());
    } else {
      nxd::ckpt::export_hf(tag, a.pos[1], {.merge_lora = a.merge_lora});
      std::printf("%s -> %s/{model.safetensors,config.json}\n", tag.string().c_str(),
                  a.pos[1].c_str());
    }
    return 0;
  }
  if (a.cmd == "reshard") return reshard(a);
  if (a.cmd == "import" || a.cmd == "import-hf" || a.cmd == "import-gguf") return import(a);
  throw Usage("unknown command '" + a.cmd + "'");
}

// export writes OUT, export-hf OUT/{model.safetensors,config.json}: none may exist already.
void refuse_to_overwrite(const std::string& cmd, const fs::path& out) {
  std::error_code ec;
  std::vector<fs::path> taken;
  if (cmd == "export" && fs::exists(out, ec)) taken.push_back(out);
  if (cmd == "export-hf" || cmd == "export-lora") {
    if (fs::exists(out, ec) && !fs::is_directory(out, ec))
      throw nxd::IoError("[nxd-ckpt] " + cmd + ": " + out.string() +
                         " is an existing file, not a folder (not overwritten)");
    const bool hf = cmd == "export-hf";
    for (const char* f : {hf ? "model.safetensors" : "adapter_model.safetensors",
                          hf ? "config.json" : "adapter_config.json"})
      if (fs::exists(out / f, ec)) taken.push_back(out / f);
  }
  if (!taken.empty())
    throw nxd::IoError("[nxd-ckpt] " + cmd + ": " + taken.front().string() +
                       " exists already (not overwritten: remove it or choose another OUT)");
}

}  // namespace

int main(int argc, char** argv) {
  return nxd::cli::run_main("nxd-ckpt", [&] {
    try {
      return run(std::vector<std::string>(argv + 1, argv + argc));
    } catch (const Usage& e) {
      std::fprintf(stderr, "nxd-ckpt: error: %s\n%s", nxd::io::one_line(e.what()).c_str(), kUsage);
      return 2;
    }
  });
}

#include "nxd/checkpoint/model_source.h"

#include <algorithm>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/error.h"
#include "nxd/checkpoint/gguf_llama.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/lora_files.h"
#include "nxd/checkpoint/offline.h"

namespace nxd::ckpt {
namespace fs = std::filesystem;

namespace {

void check(const ModelSourceOptions& o, const ModelConfig& cfg, const std::string& source) {
  if (o.check_config) o.check_config(cfg, source);
}

// The config and weights of --checkpoint, --gguf or --hf.
ModelSource read_source(const ModelSourceOptions& o) {
  ModelSource s;
  if (!o.checkpoint.empty() && is_quantized_checkpoint(o.checkpoint)) {
    if (!o.lora.empty())
      throw ConfigError(str("[", o.tool, "] --lora ", o.lora, " cannot merge into the quantized ",
                            "checkpoint ", o.checkpoint,
                            " (merge before quantizing: nxd-ckpt quantize)"));
    auto q = std::make_shared<QuantizedCheckpoint>(read_quantized_checkpoint(o.checkpoint));
    s.cfg = q->cfg;
    check(o, s.cfg, q->file.string());
    s.quantized = std::move(q);
  } else if (!o.checkpoint.empty()) {
    s.tag_dir = resolve_checkpoint(o.checkpoint);
    const auto meta = read_metadata(s.tag_dir);
    if (!meta.contains("model_config"))
      throw CheckpointError(str("[", o.tool, "] ", s.tag_dir.string(),
                                " records no model_config (not a CausalLM checkpoint)"));
    s.cfg = model_config_from_json(meta["model_config"]);
    if (meta.contains("lora") && o.lora_checkpoints == LoraCheckpoints::refuse)
      throw ConfigError(str("--checkpoint ", s.tag_dir.string(),
                            " holds LoRA adapters: merge them first (nxd-ckpt export-hf "
                            "--merge-lora) and serve that folder with --hf"));
    check(o, s.cfg, s.tag_dir.string() + "/metadata.json");
  } else if (!o.gguf.empty()) {
    GgufModel g = read_gguf_model(o.gguf);
    s.head = gguf_quantized_head(g, o.gguf);
    s.cfg = g.cfg;
    s.full = std::move(g.full);
    s.hf_dir = o.gguf;
    check(o, s.cfg, o.gguf);
  } else {
    s.cfg = read_hf_config(o.hf);  // sharded, F16/BF16 files as transformers reads them
    check(o, s.cfg, (fs::path(o.hf) / "config.json").string());
    s.hf_dir = o.hf;
    s.full = read_hf_weights(o.hf, s.cfg);
  }
  return s;
}

}  // namespace

ModelSource resolve_model_source(const ModelSourceOptions& o) {
  ModelSource s = read_source(o);
  // LoRA: a checkpoint's own adapters and --lora's are merged into full weights
  const bool own = !s.tag_dir.empty() && read_metadata(s.tag_dir).contains("lora");
  if (own || (!o.lora.empty() && !s.tag_dir.empty())) {
    PeftAdapter a;
    s.full = read_model_and_adapter(s.tag_dir, &a);
    if (own) merge_adapter(s.full, a, s.tag_dir.string());
    s.hf_dir = s.tag_dir.string();
    s.tag_dir.clear();
  }
  if (!o.lora.empty()) merge_adapter(s.full, read_peft_adapter(o.lora), o.lora);
  s.cfg.sequence_parallel = false;  // inference: no sequence parallelism
  s.cfg.dropout = 0.0;
  s.cfg.kv_size_multiplier = std::max<int64_t>(1, o.tp / s.cfg.kv_heads());
  s.cfg.validate();
  s.cfg.validate_parallel(o.tp);
  return s;
}

std::shared_ptr<CausalLM> build_model(const ModelSource& s) {
  auto m = make_causal_lm(s.cfg, 0);
  if (s.quantized) {
    load_quantized_weights(*m, *s.quantized);
  } else if (!s.tag_dir.empty()) {
    LoadOptions lo;
    lo.tag = s.tag_dir.filename().string();
    load_checkpoint(s.tag_dir.parent_path(), m.get(), nullptr, nullptr, lo);
  } else {
    load_full_tensors({m.get()}, s.full, s.hf_dir);
  }
  if (s.head) load_quantized_head(*m, *s.head);
  return m;
}

void set_source_path(ModelSourceOptions& o, const std::string& path) {
  o.checkpoint.clear(), o.hf.clear(), o.gguf.clear();
  if (fs::is_regular_file(path))
    o.gguf = path;
  else if (fs::is_regular_file(fs::path(path) / "config.json"))
    o.hf = path;
  else
    o.checkpoint = path;
}

}  // namespace nxd::ckpt

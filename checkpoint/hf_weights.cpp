// The weights of a transformers folder (plain safetensors, F32/F16/BF16, one file or shards
// through model.safetensors.index.json) and of the other sources model.init_from accepts.
#include <cstring>
#include <fstream>
#include <set>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/checkpoint/reshard.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/io/hf_folder.h"
#include "nxd/io/safetensors.h"
#include "nxd/layers/parallel/attributes.h"

namespace nxd::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What transformers does not load as weights (hf.h).
void drop_non_weights(std::map<std::string, Tensor>& w, const ModelConfig& cfg,
                      std::vector<std::string>* notes) {
  int64_t buffers = 0;
  for (auto it = w.begin(); it != w.end();) {
    const std::string& n = it->first;
    if (ends_with(n, "rotary_emb.inv_freq") ||
        (cfg.arch == "gpt_neox" &&
         (ends_with(n, ".attention.bias") || ends_with(n, ".attention.masked_bias")))) {
      it = w.erase(it);
      ++buffers;
    } else {
      ++it;
    }
  }
  if (buffers > 0 && notes)
    notes->push_back(str("ignored ", buffers,
                         " buffer(s) transformers does not load (rotary_emb.inv_freq, "
                         "attention.bias / masked_bias)"));
  const std::string head = cfg.arch == "gpt_neox" ? "embed_out.weight" : "lm_head.weight";
  if (cfg.tie_word_embeddings && w.erase(head) && notes)
    notes->push_back(str("ignored ", head, ": tie_word_embeddings uses the input embedding"));
}

}  // namespace

std::map<std::string, Tensor> read_hf_weights(const fs::path& hf_dir, const ModelConfig& cfg,
                                              std::vector<std::string>* notes) {
  std::map<std::string, Tensor> w = io::read_hf_tensors(hf_dir, notes);
  drop_non_weights(w, cfg, notes);
  return w;
}

void load_full_tensors(const std::vector<Module*>& modules,
                       const std::map<std::string, Tensor>& full, const std::string& source,
                       const LoadFullOptions& opts) {
  const int rank = parallel_state::model_parallel_is_initialized()
                       ? parallel_state::get_tensor_model_parallel_rank()
                       : 0;
  NoGradGuard g;
  for (Module* m : modules) {
    std::map<std::string, ShardSpec> spec;
    for (const auto& p : parallel_parameters(*m)) spec[p.name] = shard_spec(p.attrs);
    for (const auto& [n, t] : m->state_dict()) {
      if (opts.skip && opts.skip->count(n)) continue;
      const auto it = full.find(n);
      if (it == full.end())
        throw CheckpointError(str("[import] ", source, " has no tensor '", n, "'"));
      const ShardSpec s = spec.count(n) ? spec[n] : ShardSpec{};
      const Shape want = full_shape(t.shape(), s);
      if (it->second.shape() != want || (opts.same_dtype && it->second.dtype() != t.dtype()))
        throw CheckpointError(str("[import] ", source, ": tensor '", n, "' is ",
                                  io::safetensors_dtype(it->second.dtype()),
                                  shape_str(it->second.shape()), ", the model needs ",
                                  io::safetensors_dtype(t.dtype()), shape_str(want)));
      const Tensor src = it->second.dtype() == t.dtype() ? it->second : it->second.to(t.dtype());
      t.detach().copy_(shard_view(src, s, rank));
      if (opts.used) opts.used->insert(n);
    }
  }
}

WeightSource inspect_weight_source(const fs::path& path) {
  WeightSource s;
  s.path = path;
  if (fs::is_directory(path) && io::is_hf_folder(path)) {
    s.kind = WeightSource::Kind::hf_folder;
    s.config = read_hf_config(path);
    s.description = str("the transformers folder ", path.string(), " (", s.config.arch, ")");
    return s;
  }
  if (fs::is_regular_file(path)) {
    const io::SafetensorsHeader h = io::SafetensorsReader(path).header();
    const auto mc = h.metadata.find("nxd.model_config");
    if (mc == h.metadata.end())
      throw CheckpointError(str("[init_from] ", path.string(),
                                " is a file without nxd.model_config in its metadata (not written "
                                "by nxd-ckpt export)"));
    s.kind = WeightSource::Kind::merged_file;
    s.config = model_config_from_json(json::parse(mc->second));
    s.description = str("the exported file ", path.string());
    return s;
  }
  if (!fs::is_directory(path))
    throw CheckpointError(str("[init_from] ", path.string(), " does not exist"));
  fs::path dir = path;
  if (!fs::exists(dir / "checkpoint") && !has_checkpoint(dir) &&
      has_checkpoint(dir / "checkpoints"))
    dir = dir / "checkpoints";  // a run folder
  if (!fs::exists(dir / "checkpoint") && !has_checkpoint(dir))
    throw CheckpointError(
        str("[init_from] ", path.string(),
            " is neither a transformers folder (config.json + model.safetensors), "
            "an nxd checkpoint, a folder of checkpoints, a run folder (with "
            "checkpoints/) nor an exported .safetensors file"));
  s.kind = WeightSource::Kind::checkpoint;
  s.path = resolve_checkpoint(dir);
  const json meta = read_metadata(s.path);
  if (!meta.contains("model_config"))
    throw CheckpointError(
        str("[init_from] ", s.path.string(), " records no model_config (not a CausalLM's)"));
  s.config = model_config_from_json(meta["model_config"]);
  s.step = meta.value("step", int64_t{0});
  const json& p = meta.at("parallel");
  s.description = str("the checkpoint ", s.path.string(), " (step ", s.step, ", tp ",
                      p.value("tp", 1), " pp ", p.value("pp", 1), " dp ", p.value("dp", 1), ")");
  return s;
}

std::map<std::string, Tensor> read_source_weights(const WeightSource& src,
                                                  std::vector<std::string>* notes) {
  if (src.kind == WeightSource::Kind::hf_folder)
    return read_hf_weights(src.path, src.config, notes);
  std::vector<std::pair<std::string, Tensor>> v = src.kind == WeightSource::Kind::merged_file
                                                      ? io::SafetensorsReader(src.path).read_all()
                                                      : read_merged_model(src.path);
  std::map<std::string, Tensor> w;
  for (auto& [n, t] : v) w[n] = t.to(DType::f32);
  return w;
}

}  // namespace nxd::ckpt

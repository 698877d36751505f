// The weights of a transformers folder (plain safetensors, F32/F16/BF16, one file or shards
// through model.safetensors.index.json) and of the other sources model.init_from accepts.
#include <cstring>
#include <fstream>
#include <set>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/checkpoint/reshard.h"
#include "nxd/checkpoint/safetensors.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/attributes.h"

namespace nxd::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while (!(mant & 0x400u));
      bits = sign | ((127 - 15 - static_cast<uint32_t>(e)) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// One transformers safetensors file, every tensor cast to f32 into `out`. HF files carry no
// checksums; sizes and offsets are checked against the file.
void read_hf_file(const fs::path& file, std::map<std::string, Tensor>& out,
                  const std::set<std::string>* only = nullptr) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw CheckpointError(str("[import-hf] cannot read ", file.string()));
  const auto file_size = static_cast<int64_t>(fs::file_size(file));
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (!in || static_cast<int64_t>(n) > file_size - 8)
    throw CheckpointError(str("[import-hf] ", file.string(), " is not a safetensors file"));
  std::string head(n, '\0');
  in.read(head.data(), static_cast<std::streamsize>(n));
  json h;
  try {
    h = json::parse(head);
  } catch (const std::exception& e) {
    throw CheckpointError(str("[import-hf] ", file.string(), ": bad header: ", e.what()));
  }
  const int64_t data_start = 8 + static_cast<int64_t>(n);
  std::vector<char> buf;
  for (const auto& [name, e] : h.items()) {
    if (name == "__metadata__" || (only && !only->count(name))) continue;
    const std::string dt = e.at("dtype").get<std::string>();
    const Shape shape = e.at("shape").get<Shape>();
    const auto off = e.at("data_offsets").get<std::vector<int64_t>>();
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const int64_t size = dt == "F32" ? 4 : (dt == "F16" || dt == "BF16") ? 2 : 0;
    if (size == 0)
      throw CheckpointError(str("[import-hf] ", file.string(), ": tensor '", name, "' is ", dt,
                                " (F32, F16 and BF16 are read)"));
    if (off.size() != 2 || off[1] - off[0] != numel * size || off[0] < 0 ||
        data_start + off[1] > file_size)
      throw CheckpointError(str("[import-hf] ", file.string(), ": tensor '", name, "' ", dt,
                                shape_str(shape), " has data offsets ", e["data_offsets"].dump(),
                                " outside the file or of the wrong size (file ", file_size,
                                " bytes)"));
    buf.resize(static_cast<size_t>(numel * size));
    in.seekg(data_start + off[0]);
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (!in)
      throw CheckpointError(str("[import-hf] ", file.string(), ": cannot read '", name, "'"));
    Tensor t = empty(shape, DType::f32);
    float* d = t.data<float>();
    for (int64_t i = 0; i < numel; ++i) {
      if (dt == "F32") {
        std::memcpy(&d[i], buf.data() + 4 * i, 4);
      } else {
        uint16_t v;
        std::memcpy(&v, buf.data() + 2 * i, 2);
        if (dt == "F16") {
          d[i] = half_to_float(v);
        } else {
          const uint32_t bits = static_cast<uint32_t>(v) << 16;
          std::memcpy(&d[i], &bits, 4);
        }
      }
    }
    out[name] = t;
  }
}

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

bool is_hf_folder(const fs::path& dir) {
  return fs::is_regular_file(dir / "config.json") &&
         (fs::is_regular_file(dir / "model.safetensors") ||
          fs::is_regular_file(dir / "model.safetensors.index.json"));
}

std::map<std::string, Tensor> read_hf_weights(const fs::path& hf_dir, const ModelConfig& cfg,
                                              std::vector<std::string>* notes) {
  std::map<std::string, Tensor> w;
  const fs::path index = hf_dir / "model.safetensors.index.json";
  if (fs::is_regular_file(hf_dir / "model.safetensors")) {
    read_hf_file(hf_dir / "model.safetensors", w);
  } else if (fs::is_regular_file(index)) {
    std::map<std::string, std::set<std::string>> by_file;
    try {
      const json j = json::parse(read_file(index));
      for (const auto& [name, f] : j.at("weight_map").items())
        by_file[f.get<std::string>()].insert(name);
    } catch (const CheckpointError&) {
      throw;
    } catch (const std::exception& e) {
      throw CheckpointError(str("[import-hf] ", index.string(), ": ", e.what()));
    }
    for (const auto& [f, names] : by_file) {
      if (f.find('/') != std::string::npos || f == ".." || !fs::is_regular_file(hf_dir / f))
        throw CheckpointError(str("[import-hf] ", index.string(), " lists shard '", f,
                                  "', which is not a file of ", hf_dir.string()));
      const size_t before = w.size();
      read_hf_file(hf_dir / f, w, &names);
      if (w.size() - before != names.size())
        for (const auto& n : names)
          if (!w.count(n))
            throw CheckpointError(str("[import-hf] ", (hf_dir / f).string(), " has no tensor '", n,
                                      "' (listed in ", index.string(), ")"));
    }
    if (notes)
      notes->push_back(str("read ", by_file.size(), " shard(s) listed in ", index.string()));
  } else {
    throw CheckpointError(str("[import-hf] ", hf_dir.string(),
                              " has neither model.safetensors nor model.safetensors.index.json"));
  }
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
      const auto it = full.find(n);
      if (it == full.end())
        throw CheckpointError(str("[import] ", source, " has no tensor '", n, "'"));
      const ShardSpec s = spec.count(n) ? spec[n] : ShardSpec{};
      const Shape want = full_shape(t.shape(), s);
      if (it->second.shape() != want || (opts.same_dtype && it->second.dtype() != t.dtype()))
        throw CheckpointError(str("[import] ", source, ": tensor '", n, "' is ",
                                  safetensors_dtype(it->second.dtype()),
                                  shape_str(it->second.shape()), ", the model needs ",
                                  safetensors_dtype(t.dtype()), shape_str(want)));
      const Tensor src = it->second.dtype() == t.dtype() ? it->second : it->second.to(t.dtype());
      t.detach().copy_(shard_view(src, s, rank));
      if (opts.used) opts.used->insert(n);
    }
  }
}

WeightSource inspect_weight_source(const fs::path& path) {
  WeightSource s;
  s.path = path;
  if (fs::is_directory(path) && is_hf_folder(path)) {
    s.kind = WeightSource::Kind::hf_folder;
    s.config = read_hf_config(path);
    s.description = str("the transformers folder ", path.string(), " (", s.config.arch, ")");
    return s;
  }
  if (fs::is_regular_file(path)) {
    const SafetensorsHeader h = SafetensorsReader(path).header();
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
                                                      ? SafetensorsReader(src.path).read_all()
                                                      : read_merged_model(src.path);
  std::map<std::string, Tensor> w;
  for (auto& [n, t] : v) w[n] = t.to(DType::f32);
  return w;
}

}  // namespace nxd::ckpt

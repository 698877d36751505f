#include "nxd/checkpoint/offline.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/dp_shards.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/integrity.h"
#include "nxd/checkpoint/layout.h"
#include "nxd/checkpoint/lora_files.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/optim/zero1.h"
#include "nxd/pipeline/pipeline_model.h"

namespace nxd::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path resolve_checkpoint(const fs::path& dir) {
  if (fs::exists(dir / detail::kMarker)) return dir;
  if (!fs::is_directory(dir))
    throw CheckpointError(str("[nxd-ckpt] ", dir.string(), " is not a folder"));
  auto t = newest_checkpoint(dir);
  if (!t && fs::is_directory(dir / "checkpoints"))  // a run folder (nxd-train's --out)
    if (auto r = newest_checkpoint(dir / "checkpoints")) return dir / "checkpoints" / *r;
  if (!t) throw CheckpointError(str("[nxd-ckpt] no complete checkpoint under ", dir.string()));
  return dir / *t;
}

namespace {

// A ZeRO-3 checkpoint's blocks ("parallel": {"zero3": true}) copied into `full`: each (tp, pp)
// rank's TP-local tensors assembled from its DP files (index_dp_files checks the tiling), each
// block read straight to its place.
void read_zero3_blocks(const fs::path& tag_dir, const json& meta,
                       std::vector<std::pair<std::string, Tensor>>& full,
                       const std::map<std::string, size_t>& index,
                       const std::map<std::string, ShardSpec>& spec) {
  const SavedLayout saved = saved_layout(meta);
  for (int pp = 0; pp < saved.pp; ++pp)
    for (int tp = 0; tp < saved.tp; ++tp) {
      const detail::DpIndex idx = detail::index_dp_files(tag_dir, {.dp_size = saved.dp,
                                                                   .tp_rank = tp,
                                                                   .pp_rank = pp,
                                                                   .compressed = saved.compressed,
                                                                   .kind = "model"});
      std::map<std::string, Tensor> local;  // this (tp, pp) rank's whole tensors, contiguous
      std::map<std::string, std::map<std::string, char*>> dst;  // file -> tensor -> where
      for (const auto& [name, e] : meta["model"].items()) {
        const ShardSpec& s = spec.at(name);
        const auto ranks = covering_ranks(s);
        if (e.at("pp_rank").get<int>() != pp ||
            std::find(ranks.begin(), ranks.end(), tp) == ranks.end())
          continue;
        const auto it = idx.tensors.find(name);
        Tensor t = shard_view(full[index.at(name)].second, s, tp).contiguous().clone();
        if (it == idx.tensors.end() || it->second.shape != t.shape() ||
            it->second.dtype != t.dtype())
          throw CheckpointError(str(
              "[export] ", tag_dir.string(), ": model tensor '", name, "' of tp rank ", tp,
              " pp rank ", pp, " is ",
              it == idx.tensors.end() ? std::string("in no DP shard") : shape_str(it->second.shape),
              ", expected ", t.desc()));
        for (const detail::Piece& p : it->second.pieces)
          dst[p.file][name] = static_cast<char*>(t.raw_data()) + p.lo * dtype_size(t.dtype());
        local[name] = t;
      }
      for (const auto& [rel, want] : dst) {
        io::SafetensorsReader r(tag_dir / rel);
        detail::check_shard_identity(r.header(), rel, (tag_dir / rel).string(), "[export]");
        r.read([&](const io::TensorInfo& t) -> void* {
          const auto w = want.find(t.name);
          return w == want.end() || t.nbytes() == 0 ? nullptr : w->second;
        });
      }
      for (auto& [name, t] : local)
        shard_view(full[index.at(name)].second, spec.at(name), tp).copy_(t);
    }
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> read_merged_model(const fs::path& tag_dir) {
  const json meta = read_metadata(tag_dir);
  if (!meta.contains("model"))
    throw CheckpointError(str("[export] ", tag_dir.string(), " holds no model"));
  const bool z = saved_layout(meta).compressed;
  const bool zero3 = saved_layout(meta).zero3;
  // name -> full tensor; each saved shard is read once and copied into its block
  std::vector<std::pair<std::string, Tensor>> full;
  std::map<std::string, size_t> index;
  std::map<std::string, ShardSpec> spec;
  std::map<std::string, std::vector<std::pair<std::string, int64_t>>> by_file;  // name, tp rank
  for (const auto& [name, e] : meta["model"].items()) {
    const ShardSpec s = e.contains("split") ? shard_spec_from_json(e["split"], name) : ShardSpec{};
    bool ok = false;
    for (DType d : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64})
      if (e.at("dtype").get<std::string>() == io::safetensors_dtype(d)) {
        index[name] = full.size();
        full.emplace_back(name, empty(e.at("shape").get<Shape>(), d));
        ok = true;
      }
    if (!ok)
      throw CheckpointError(str("[export] ", name, ": unknown dtype ", e.at("dtype").dump()));
    spec[name] = s;
    if (zero3) continue;  // read_zero3_blocks
    const int pp = e.at("pp_rank").get<int>(), dp = e.value("dp_rank", 0);
    for (int64_t r : covering_ranks(s))  // an expert's shards: in its EP rank's files
      by_file[detail::shard_file(
                  "model",
                  {.dp_rank = dp, .tp_rank = static_cast<int>(r), .pp_rank = pp, .compressed = z})]
          .emplace_back(name, r);
  }
  for (const auto& [rel, items] : by_file) {
    std::map<std::string, int64_t> want(items.begin(), items.end());
    std::map<std::string, Tensor> part;
    io::SafetensorsReader r(tag_dir / rel);
    for (const auto& [name, tp] : want)
      if (!r.header().find(name))
        throw CheckpointError(str("[export] ", (tag_dir / rel).string(), ": tensor '", name,
                                  "' is listed in metadata.json but not in the file"));
    r.read([&](const io::TensorInfo& t) -> void* {
      if (!want.count(t.name) || t.nbytes() == 0) return nullptr;
      Tensor v = shard_view(full[index.at(t.name)].second, spec[t.name], want[t.name]);
      if (v.shape() != t.shape)
        throw CheckpointError(str("[export] ", (tag_dir / rel).string(), ": tensor '", t.name,
                                  "' is ", shape_str(t.shape), ", its block is ",
                                  shape_str(v.shape())));
      part[t.name] = empty(t.shape, t.dtype);
      return part[t.name].raw_data();
    });
    for (auto& [name, t] : part)
      shard_view(full[index.at(name)].second, spec[name], want[name]).copy_(t);
  }
  if (zero3) read_zero3_blocks(tag_dir, meta, full, index, spec);
  return full;
}

void export_merged(const fs::path& tag_dir, const fs::path& out) {
  const json meta = read_metadata(tag_dir);
  const auto full = read_merged_model(tag_dir);
  std::map<std::string, std::string> md{{"nxd.source", tag_dir.string()}};
  if (meta.contains("model_config")) md["nxd.model_config"] = meta["model_config"].dump();
  io::write_safetensors(out, full, md);
}

void import_full_tensors(const std::map<std::string, Tensor>& full, const std::string& source,
                         ModelConfig cfg, const fs::path& out_root, const std::string& tag, int tp,
                         int dp) {
  NXD_CHECK_T(ConfigError, tp >= 1 && dp >= 1, "[import] degrees must be >= 1, got tp=", tp,
              " dp=", dp);
  cfg.kv_size_multiplier = std::max<int64_t>(1, tp / cfg.kv_heads());
  cfg.validate_parallel(tp);
  sim::launch(tp * dp, [&] {
    parallel_state::initialize_model_parallel(tp);
    auto model = make_causal_lm(cfg, 0);
    std::set<std::string> used;
    load_full_tensors({model.get()}, full, source, {.same_dtype = true, .used = &used});
    if (used.size() != full.size())
      for (const auto& [n, t] : full)
        if (!used.count(n))
          throw CheckpointError(
              str("[import] ", source, ": tensor '", n, "' is not a parameter of the model"));
    save_checkpoint(out_root, tag, model.get(), nullptr, nullptr);
  });
}

void import_merged(const fs::path& file, const fs::path& out_root, const std::string& tag, int tp,
                   int dp) {
  const io::SafetensorsHeader h = io::SafetensorsReader(file).header();
  const auto mc = h.metadata.find("nxd.model_config");
  if (mc == h.metadata.end())
    throw CheckpointError(str("[import] ", file.string(),
                              " has no nxd.model_config in its metadata (not an nxd export)"));
  json cj;
  try {
    cj = json::parse(mc->second);
  } catch (const std::exception& e) {
    throw CheckpointError(str("[import] ", file.string(), ": nxd.model_config: ", e.what()));
  }
  std::map<std::string, Tensor> full;
  for (auto& [n, t] : io::SafetensorsReader(file).read_all()) full[n] = t;
  import_full_tensors(full, file.string(), model_config_from_json(cj), out_root, tag, tp, dp);
}

void export_hf(const fs::path& tag_dir, const fs::path& out_dir, const ExportHfOptions& opts) {
  const json meta = read_metadata(tag_dir);
  if (!meta.contains("model_config"))
    throw CheckpointError(str("[export-hf] ", tag_dir.string(), " records no model_config"));
  const json cfg = hf_config_json(model_config_from_json(meta["model_config"]));
  if (meta.contains("lora")) {
    PeftAdapter a;
    auto full = read_model_and_adapter(tag_dir, &a);
    if (!opts.merge_lora && !a.config.merge_lora)
      throw CheckpointError(str("[export-hf] ", tag_dir.string(),
                                " has LoRA adapters: --merge-lora merges them into the base "
                                "weights; nxd-ckpt export-lora writes them alone (PEFT)"));
    merge_adapter(full, a, tag_dir.string());
    fs::create_directories(out_dir);
    io::write_safetensors(
        out_dir / "model.safetensors", {full.begin(), full.end()},
        {{"nxd.source", tag_dir.string()}, {"nxd.model_config", meta["model_config"].dump()}});
    io::write_file_atomic(out_dir / "config.json", cfg.dump(2) + "\n");
    return;
  }
  fs::create_directories(out_dir);
  export_merged(tag_dir, out_dir / "model.safetensors");
  io::write_file_atomic(out_dir / "config.json", cfg.dump(2) + "\n");
}

void import_hf(const fs::path& hf_dir, const fs::path& out_root, const std::string& tag, int tp,
               int dp) {
  const ModelConfig cfg = read_hf_config(hf_dir);
  import_full_tensors(read_hf_weights(hf_dir, cfg), hf_dir.string(), cfg, out_root, tag, tp, dp);
}

namespace {
json model_config_json_dense(const ModelConfig& c);
}  // namespace

json model_config_json(const ModelConfig& c) {
  json j = model_config_json_dense(c);
  if (c.moe.enabled())  // dense models keep the form they always had
    j["moe"] = {{"num_experts", c.moe.num_experts},
                {"top_k", c.moe.top_k},
                {"frequency", c.moe.frequency},
                {"capacity_factor", c.moe.capacity_factor},
                {"dropless", c.moe.dropless},
                {"router_aux_loss_coef", c.moe.router_aux_loss_coef},
                {"router_z_loss_coef", c.moe.router_z_loss_coef},
                {"normalize_top_k_affinities", c.moe.normalize_top_k_affinities}};
  return j;
}

namespace {
json model_config_json_dense(const ModelConfig& c) {
  return {{"arch", c.arch},
          {"vocab_size", c.vocab_size},
          {"num_layers", c.num_layers},
          {"hidden_size", c.hidden_size},
          {"num_attention_heads", c.num_attention_heads},
          {"num_kv_heads", c.num_kv_heads},
          {"attention_head_dim", c.attention_head_dim},
          {"ffn_hidden_size", c.ffn_hidden_size},
          {"max_position_embeddings", c.max_position_embeddings},
          {"rotary_pct", c.rotary_pct},
          {"rope_theta", c.rope_theta},
          {"rope_scaling", io::rope_scaling_json(c.rope_scaling)},
          {"norm_eps", c.norm_eps},
          {"init_method", init_method_name(c.init_method)},
          {"init_std", c.init_std},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"dropout", c.dropout},
          {"gelu_tanh", c.gelu_tanh},
          {"use_parallel_residual", c.use_parallel_residual},
          {"hidden_act", c.hidden_act},
          {"attention_bias", c.attention_bias},
          {"mlp_bias", c.mlp_bias},
          {"qkv_bias", c.qkv_bias},
          {"qk_norm", c.qk_norm},
          {"sliding_window", c.sliding_window},
          {"dtype", dtype_name(c.dtype)},
          {"sequence_parallel", c.sequence_parallel},
          {"kv_size_multiplier", c.kv_size_multiplier}};
}
}  // namespace

ModelConfig model_config_from_json(const json& j) {
  try {
    ModelConfig c;
    c.arch = j.at("arch").get<std::string>();
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.num_layers = j.at("num_layers").get<int64_t>();
    c.hidden_size = j.at("hidden_size").get<int64_t>();
    c.num_attention_heads = j.at("num_attention_heads").get<int64_t>();
    c.num_kv_heads = j.at("num_kv_heads").get<int64_t>();
    c.attention_head_dim = j.value("attention_head_dim", int64_t{0});
    c.ffn_hidden_size = j.at("ffn_hidden_size").get<int64_t>();
    c.max_position_embeddings = j.at("max_position_embeddings").get<int64_t>();
    c.rotary_pct = j.at("rotary_pct").get<double>();
    c.rope_theta = j.at("rope_theta").get<double>();
    c.rope_scaling = io::read_rope_scaling(j);
    c.norm_eps = j.at("norm_eps").get<double>();
    c.init_method = parse_init_method(j.value("init_method", std::string("normal")));
    c.init_std = j.at("init_std").get<double>();
    c.tie_word_embeddings = j.at("tie_word_embeddings").get<bool>();
    c.dropout = j.at("dropout").get<double>();
    c.gelu_tanh = j.at("gelu_tanh").get<bool>();
    c.use_parallel_residual = j.at("use_parallel_residual").get<bool>();
    c.hidden_act = j.value("hidden_act", std::string("silu"));
    c.attention_bias = j.value("attention_bias", false);
    c.mlp_bias = j.value("mlp_bias", false);
    c.qkv_bias = j.value("qkv_bias", false);
    c.qk_norm = j.value("qk_norm", false);
    c.sliding_window = j.value("sliding_window", int64_t{0});
    c.dtype = dtype_from_name(j.at("dtype").get<std::string>());
    c.sequence_parallel = j.at("sequence_parallel").get<bool>();
    c.kv_size_multiplier = j.at("kv_size_multiplier").get<int64_t>();
    if (j.contains("moe")) {
      const json& m = j["moe"];
      c.moe.num_experts = m.at("num_experts").get<int64_t>();
      c.moe.top_k = m.at("top_k").get<int64_t>();
      c.moe.frequency = m.at("frequency").get<int64_t>();
      c.moe.capacity_factor = m.at("capacity_factor").get<double>();
      c.moe.dropless = m.at("dropless").get<bool>();
      c.moe.router_aux_loss_coef = m.at("router_aux_loss_coef").get<double>();
      c.moe.router_z_loss_coef = m.at("router_z_loss_coef").get<double>();
      c.moe.normalize_top_k_affinities = m.at("normalize_top_k_affinities").get<bool>();
    }
    return c;
  } catch (const std::exception& e) {
    throw CheckpointError(str("[checkpoint] bad model_config ", j.dump(), ": ", e.what()));
  }
}

}  // namespace nxd::ckpt

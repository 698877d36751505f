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

// What load checks of a shard (integrity.h), and that its header agrees with metadata.json (size,
// dtypes, whole shapes); then every tensor is read (checksums) and model tensors must be finite.
void verify_shard(const json& meta, const std::string& rel, const json& info, SafetensorsReader& r,
                  VerifyReport& rep) {
  const std::string p = r.path().string();
  detail::check_shard_identity(r.header(), rel, p, "[verify]");
  const int64_t want_bytes = info.at("bytes").get<int64_t>();
  if (r.file_size() != want_bytes)
    throw CheckpointError(str("[verify] ", p, " has ", r.file_size(), " bytes, metadata.json says ",
                              want_bytes, " (truncated or replaced)"));
  const bool model = rel.rfind("model/", 0) == 0;
  const bool zero1_optim = !model && meta.at("parallel").value("zero1", false);
  if (!zero1_optim) {  // ZeRO-1 files hold parts: index_dp_files checks them below
    const json& table = model ? meta.at("model") : meta.at("optimizer").at("tensors");
    const auto specs = detail::specs_of(r.header(), rel);
    for (const auto& t : r.header().tensors) {
      if (!table.contains(t.name))
        throw CheckpointError(
            str("[verify] ", p, ": tensor '", t.name, "' is not listed in metadata.json"));
      const json& e = table.at(t.name);
      auto it = specs.find(t.name);
      const Shape whole = full_shape(t.shape, it == specs.end() ? ShardSpec{} : it->second);
      if (e.at("dtype").get<std::string>() != safetensors_dtype(t.dtype) ||
          e.at("shape").get<Shape>() != whole)
        throw CheckpointError(str("[verify] ", p, ": tensor '", t.name, "' is ",
                                  safetensors_dtype(t.dtype), shape_str(whole),
                                  " (whole), metadata.json says ", e.at("dtype").get<std::string>(),
                                  e.at("shape").dump()));
    }
  }
  std::vector<char> buf;
  std::optional<TensorInfo> last;  // the tensor in buf, checked when the next one starts
  auto finite = [&] {
    if (!last || !model) return;
    if (const int64_t bad = detail::count_nonfinite(
            buf.data(), last->nbytes() / dtype_size(last->dtype), last->dtype))
      throw CheckpointError(str("[verify] ", p, ": model tensor '", last->name, "' holds ", bad,
                                " NaN or infinite value(s)"));
  };
  r.read([&](const TensorInfo& t) -> void* {
    finite();
    ++rep.tensors;
    rep.bytes += t.nbytes();
    buf.resize(static_cast<size_t>(t.nbytes()) + 1);
    last = t;
    return buf.data();
  });
  finite();
}

}  // namespace

VerifyReport verify_checkpoint(const fs::path& tag_dir) {
  const json meta = read_metadata(tag_dir);
  VerifyReport rep;
  for (const auto& [rel, info] : meta.at("files").items()) {
    const fs::path p = tag_dir / rel;
    if (!fs::exists(p)) throw CheckpointError(str("[verify] missing file ", p.string()));
    ++rep.files;
    if (rel.find(".safetensors") == std::string::npos) {
      try {
        const json parsed = json::parse(read_file(p));
        (void)parsed;
      } catch (const CheckpointError&) {
        throw;
      } catch (const std::exception& e) {
        throw CheckpointError(str("[verify] ", p.string(), " is not valid JSON: ", e.what()));
      }
      continue;
    }
    SafetensorsReader r(p);
    verify_shard(meta, rel, info, r, rep);
  }
  // ZeRO-1: the DP files of every (tp, pp) rank tile every state tensor
  const json& par = meta.at("parallel");
  if (par.value("zero1", false))
    for (int pp = 0; pp < par.at("pp").get<int>(); ++pp)
      for (int tp = 0; tp < par.at("tp").get<int>(); ++tp)
        detail::index_dp_files(tag_dir, {.dp_size = par.at("dp").get<int>(),
                                         .tp_rank = tp,
                                         .pp_rank = pp,
                                         .compressed = meta.value("compressed", false)});
  return rep;
}

std::vector<std::pair<std::string, Tensor>> read_merged_model(const fs::path& tag_dir) {
  const json meta = read_metadata(tag_dir);
  if (!meta.contains("model"))
    throw CheckpointError(str("[export] ", tag_dir.string(), " holds no model"));
  const bool z = meta.value("compressed", false);
  // name -> full tensor; each saved shard is read once and copied into its block
  std::vector<std::pair<std::string, Tensor>> full;
  std::map<std::string, size_t> index;
  std::map<std::string, ShardSpec> spec;
  std::map<std::string, std::vector<std::pair<std::string, int64_t>>> by_file;  // name, tp rank
  for (const auto& [name, e] : meta["model"].items()) {
    const ShardSpec s = e.contains("split") ? shard_spec_from_json(e["split"], name) : ShardSpec{};
    bool ok = false;
    for (DType d : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64})
      if (e.at("dtype").get<std::string>() == safetensors_dtype(d)) {
        index[name] = full.size();
        full.emplace_back(name, empty(e.at("shape").get<Shape>(), d));
        ok = true;
      }
    if (!ok)
      throw CheckpointError(str("[export] ", name, ": unknown dtype ", e.at("dtype").dump()));
    spec[name] = s;
    const int pp = e.at("pp_rank").get<int>();
    const int dp = e.value("dp_rank", 0);  // expert parallelism: the file of the expert's EP rank
    for (int64_t r : covering_ranks(s))
      by_file[detail::shard_file(
                  "model",
                  {.dp_rank = dp, .tp_rank = static_cast<int>(r), .pp_rank = pp, .compressed = z})]
          .emplace_back(name, r);
  }
  for (const auto& [rel, items] : by_file) {
    std::map<std::string, int64_t> want(items.begin(), items.end());
    std::map<std::string, Tensor> part;
    SafetensorsReader r(tag_dir / rel);
    r.read([&](const TensorInfo& t) -> void* {
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
  return full;
}

void export_merged(const fs::path& tag_dir, const fs::path& out) {
  const json meta = read_metadata(tag_dir);
  const auto full = read_merged_model(tag_dir);
  std::map<std::string, std::string> md{{"nxd.source", tag_dir.string()}};
  if (meta.contains("model_config")) md["nxd.model_config"] = meta["model_config"].dump();
  write_safetensors(out, full, md);
}

namespace {
void import_with_config(const std::map<std::string, Tensor>& full, const std::string& source,
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
}  // namespace

void import_merged(const fs::path& file, const fs::path& out_root, const std::string& tag, int tp,
                   int dp) {
  const SafetensorsHeader h = SafetensorsReader(file).header();
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
  for (auto& [n, t] : SafetensorsReader(file).read_all()) full[n] = t;
  import_with_config(full, file.string(), model_config_from_json(cj), out_root, tag, tp, dp);
}

void export_hf(const fs::path& tag_dir, const fs::path& out_dir) {
  const json meta = read_metadata(tag_dir);
  if (!meta.contains("model_config"))
    throw CheckpointError(str("[export-hf] ", tag_dir.string(), " records no model_config"));
  const json cfg = hf_config_json(model_config_from_json(meta["model_config"]));
  fs::create_directories(out_dir);
  export_merged(tag_dir, out_dir / "model.safetensors");
  write_file_atomic(out_dir / "config.json", cfg.dump(2) + "\n");
}

void import_hf(const fs::path& hf_dir, const fs::path& out_root, const std::string& tag, int tp,
               int dp) {
  const ModelConfig cfg = read_hf_config(hf_dir);
  import_with_config(read_hf_weights(hf_dir, cfg), hf_dir.string(), cfg, out_root, tag, tp, dp);
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
          {"rope_scaling", rope_scaling_json(c.rope_scaling)},
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
    c.rope_scaling = read_rope_scaling(j);
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

namespace {

// The saved optimizer's kind, options and groups over `params` (this rank's, in order). A
// parameter goes to the saved group that listed it; one no group listed (saved by another
// pipeline stage) goes by NxD's rule: "no_decay" for biases and norms, else "decay", else the
// first group. A ZeRO-1 checkpoint (`zero1`) gets a Zero1AdamW over this rank's DP group, with
// master weights if the checkpoint has them.
std::unique_ptr<optim::Optimizer> make_optimizer(const json& optimizer,
                                                 const std::vector<optim::NamedParam>& params,
                                                 bool zero1) {
  const json& info = optimizer.at("info");
  std::vector<optim::ParamGroup> groups;
  std::map<std::string, size_t> listed;
  for (const auto& g : info.at("groups")) {
    optim::ParamGroup pg;
    pg.name = g.at("name").get<std::string>();
    pg.lr = g.at("lr").get<double>();
    pg.weight_decay = g.at("weight_decay").get<double>();
    pg.lr_scale = g.at("lr_scale").get<double>();
    for (const auto& n : g.at("params")) listed[n.get<std::string>()] = groups.size();
    groups.push_back(std::move(pg));
  }
  if (groups.empty()) throw CheckpointError("[reshard] the optimizer has no parameter groups");
  auto by_name = [&](const char* name) -> size_t {
    for (size_t i = 0; i < groups.size(); ++i)
      if (groups[i].name == name) return i;
    return 0;
  };
  for (const auto& p : params) {
    const auto it = listed.find(p.name);
    const size_t gi = it != listed.end()
                          ? it->second
                          : by_name(optim::is_no_decay_param(p.name) ? "no_decay" : "decay");
    groups[gi].params.push_back(p);
  }
  groups.erase(std::remove_if(groups.begin(), groups.end(),
                              [](const optim::ParamGroup& g) { return g.params.empty(); }),
               groups.end());
  const std::string kind = info.at("kind").get<std::string>();
  const json o = info.value("options", json::object());
  if (kind == "AdamW") {
    optim::AdamWOptions a;
    a.beta1 = o.value("beta1", a.beta1);
    a.beta2 = o.value("beta2", a.beta2);
    a.eps = o.value("eps", a.eps);
    if (!zero1) return std::make_unique<optim::AdamW>(std::move(groups), a);
    for (const auto& [name, e] : optimizer.at("tensors").items())
      if (name.size() > 7 && name.compare(name.size() - 7, 7, ".master") == 0)
        a.precision.master_weights = true;
    optim::Zero1Options zo;
    zo.adamw = a;
    zo.registration_order = params;
    return std::make_unique<optim::Zero1AdamW>(std::move(groups), zo);
  }
  if (kind == "SGD") {
    optim::SGDOptions s;
    s.momentum = o.value("momentum", s.momentum);
    s.dampening = o.value("dampening", s.dampening);
    s.nesterov = o.value("nesterov", s.nesterov);
    return std::make_unique<optim::SGD>(std::move(groups), s);
  }
  throw CheckpointError(str("[reshard] unknown optimizer kind '", kind, "'"));
}

}  // namespace

void reshard_checkpoint(const fs::path& tag_dir, const fs::path& out_root, int tp, int dp, int pp) {
  const json meta = read_metadata(tag_dir);
  NXD_CHECK_T(ConfigError, tp >= 1 && dp >= 1 && pp >= 1,
              "[reshard] degrees must be >= 1, got tp=", tp, " pp=", pp, " dp=", dp);
  if (!meta.contains("model_config"))
    throw CheckpointError(str("[reshard] ", tag_dir.string(),
                              " records no model_config (not a CausalLM checkpoint)"));
  ModelConfig cfg = model_config_from_json(meta["model_config"]);
  cfg.kv_size_multiplier = std::max<int64_t>(1, tp / cfg.kv_heads());
  cfg.validate_parallel(tp);
  const bool has_optim = meta.contains("optimizer");
  const bool zero1 = meta.at("parallel").value("zero1", false);
  const fs::path src_root = tag_dir.parent_path();
  const std::string tag = tag_dir.filename().string();
  const bool has_sched = fs::exists(tag_dir / detail::kScheduler);
  sim::launch(tp * pp * dp, [&] {
    parallel_state::initialize_model_parallel(tp, pp);
    std::shared_ptr<CausalLM> whole;
    std::unique_ptr<pipeline::PipelineModel> staged;
    std::vector<Module*> chunks;
    std::vector<optim::NamedParam> params;
    if (pp == 1) {
      whole = make_causal_lm(cfg, 0);
      chunks = {whole.get()};
      for (const auto& [n, t] : whole->named_parameters()) params.push_back({n, t});
    } else {
      staged = std::make_unique<pipeline::PipelineModel>(cfg, 0);
      for (const auto& c : staged->chunks()) chunks.push_back(c.get());
      params = staged->local_named_parameters();
    }
    std::unique_ptr<optim::Optimizer> opt;
    if (has_optim) opt = make_optimizer(meta["optimizer"], params, zero1);
    optim::LRSchedule sched({});
    const json user =
        load_checkpoint(src_root, chunks, opt.get(), has_sched ? &sched : nullptr, {.tag = tag});
    save_checkpoint(
        out_root, tag, std::vector<const Module*>(chunks.begin(), chunks.end()), opt.get(),
        has_sched ? &sched : nullptr, user,
        {.compress = meta.value("compressed", false), .step = meta.value("step", int64_t{0})});
  });
}

}  // namespace nxd::ckpt

#include "nxd/checkpoint/quantized.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/error.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/checkpoint/reshard.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/io/safetensors.h"
#include "nxd/layers/models/quantize_lm.h"
#include "nxd/layers/parallel/attributes.h"

namespace nxd::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kLayout = "nxd.quantized.layout";
constexpr const char* kFormat = "nxd.quantized.format";
constexpr const char* kGroup = "nxd.quantized.group";
constexpr const char* kZero = "nxd.quantized.zero";
constexpr const char* kLayers = "nxd.quantized.layers";
constexpr const char* kHead = "nxd.quantized.head";
constexpr const char* kModelConfig = "nxd.model_config";

bool is_int4(const QuantizeOptions& o) {
  return o.format == WeightQuant::int4;
}
bool asymmetric(const QuantizeOptions& o) {
  return is_int4(o) && o.zero == kernels::Int4Zero::asymmetric;
}

// One quantized layer's sizes: the full (TP 1) weight [out, in].
struct Dims {
  int64_t out = 0, in = 0;
  int64_t row_bytes(const QuantizeOptions& o) const {
    return is_int4(o) ? kernels::Int4Layout{.n = out, .k = in, .group = o.group}.bytes_per_row()
                      : in;
  }
  int64_t words(const QuantizeOptions& o) const { return (row_bytes(o) + 3) / 4; }
  int64_t groups(const QuantizeOptions& o) const {
    return is_int4(o) ? (in + o.group - 1) / o.group : 1;
  }
};

// Rows of bytes (row_bytes each, contiguous) as I32 [rows, words], zero padded.
Tensor pack_rows(const uint8_t* bytes, int64_t rows, int64_t row_bytes) {
  const int64_t words = (row_bytes + 3) / 4;
  Tensor t = zeros({rows, words}, DType::i32);
  auto* dst = static_cast<uint8_t*>(t.raw_data());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * words * 4, bytes + r * row_bytes, static_cast<size_t>(row_bytes));
  return t;
}

Tensor f32_rows(const float* v, int64_t rows, int64_t cols) {
  Tensor t = empty({rows, cols}, DType::f32);
  std::memcpy(t.data<float>(), v, static_cast<size_t>(rows * cols) * 4);
  return t;
}

[[noreturn]] void bad(const fs::path& file, const std::string& key, const std::string& what) {
  throw CheckpointError(str("[quantized] ", file.string(), ": ", key, ": ", what));
}

const Tensor& need(const QuantizedCheckpoint& q, const std::string& key, DType dt,
                   const Shape& shape) {
  const auto it = q.tensors.find(key);
  if (it == q.tensors.end()) bad(q.file, key, "missing");
  if (it->second.dtype() != dt || it->second.shape() != shape)
    bad(q.file, key,
        str("is ", io::safetensors_dtype(it->second.dtype()), shape_str(it->second.shape()),
            ", the layout needs ", io::safetensors_dtype(dt), shape_str(shape)));
  return it->second;
}

// The rows (or columns) of the full weight this rank's shard holds, in its order.
std::vector<int64_t> shard_indices(const Shape& full, const ShardSpec& s, bool columns,
                                   int64_t rank) {
  Shape idx_shape = full;
  int64_t n = 1;
  for (size_t i = 0; i < idx_shape.size(); ++i) {
    const bool last = i + 1 == idx_shape.size();
    if (columns != last) idx_shape[i] = 1;
    n *= idx_shape[i];
  }
  Tensor idx = empty(idx_shape, DType::i64);
  for (int64_t i = 0; i < n; ++i) idx.data<int64_t>()[i] = i;
  const Tensor v = (s.split ? shard_view(idx, s, rank) : idx).contiguous();
  return std::vector<int64_t>(v.data<int64_t>(), v.data<int64_t>() + v.numel());
}

QuantizableLinear* quantizable(Module* m) {
  return dynamic_cast<QuantizableLinear*>(m);
}

// The layers quantize_causal_lm quantizes: every QuantizableLinear but the output head.
std::map<std::string, Module*> quantizable_layers(CausalLM& m) {
  std::map<std::string, Module*> r;
  const std::string head = m.output_head_name();
  for (auto& [name, mod] : m.named_modules()) {
    const bool is_head = !head.empty() && (name == head || name.rfind(head + ".", 0) == 0);
    if (quantizable(mod) && !is_head) r[name.empty() ? "weight" : name + ".weight"] = mod;
  }
  return r;
}

// This rank's quantized weight (format o) of the layer whose full weight is `w` (name) from the
// file, set on `layer`.
void set_layer(const QuantizedCheckpoint& q, const std::string& w, QuantizableLinear* layer,
               const QuantizeOptions& o, const ParallelParameter& p, int64_t rank) {
  const ShardSpec s = p.attrs.tensor_model_parallel ? shard_spec(p.attrs) : ShardSpec{};
  const Shape full = full_shape(p.tensor.shape(), s);
  Dims d;
  d.in = full.back();
  d.out = 1;
  for (size_t i = 0; i + 1 < full.size(); ++i) d.out *= full[i];
  const Tensor& qw = need(q, w + ".qweight", DType::i32, {d.out, d.words(o)});
  const Tensor& sc = need(q, w + ".scales", DType::f32, {d.out, d.groups(o)});
  const Tensor* mn =
      asymmetric(o) ? &need(q, w + ".mins", DType::f32, {d.out, d.groups(o)}) : nullptr;
  const bool cols_split = s.split && s.dim == static_cast<int64_t>(full.size()) - 1;
  const std::vector<int64_t> rows =
      cols_split ? shard_indices(full, {}, false, 0) : shard_indices(full, s, false, rank);
  const std::vector<int64_t> cols = shard_indices(full, cols_split ? s : ShardSpec{}, true, rank);
  const auto* bytes = static_cast<const uint8_t*>(qw.raw_data());
  const int64_t stride = d.words(o) * 4, n = static_cast<int64_t>(rows.size());
  const int64_t k = static_cast<int64_t>(cols.size());
  const float* scale = sc.data<float>();
  if (!is_int4(o)) {
    std::vector<int8_t> v(static_cast<size_t>(n * k));
    std::vector<float> sv(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < k; ++j)
        v[i * k + j] = static_cast<int8_t>(bytes[rows[i] * stride + cols[j]]);
      sv[i] = scale[rows[i]];
    }
    try {
      layer->set_int8_weight(Int8Weight::from_parts(n, k, std::move(v), std::move(sv)));
    } catch (const InvalidArgument& e) {
      bad(q.file, w + ".scales", e.what());
    }
    return;
  }
  // int4: a rank's columns are whole groups (and so whole 32-input blocks) of each row
  const int64_t c0 = cols.front();
  if (c0 % o.group != 0 || (k != d.in && k % o.group != 0))
    bad(q.file, w + ".qweight",
        str("this rank's ", k, " inputs from ", c0, " are not whole groups of ", o.group,
            " (use a group that divides the inputs per rank, or a smaller TP)"));
  const kernels::Int4Layout l{.n = n, .k = k, .group = o.group, .zero = o.zero};
  const int64_t b0 = c0 / 32 * 16, g0 = c0 / o.group;
  std::vector<uint8_t> v(static_cast<size_t>(l.value_bytes()));
  std::vector<float> sv(static_cast<size_t>(l.groups())), mv;
  if (mn) mv.resize(sv.size());
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(v.data() + i * l.bytes_per_row(), bytes + rows[i] * stride + b0,
                static_cast<size_t>(l.bytes_per_row()));
    for (int64_t g = 0; g < l.groups_per_row(); ++g) {
      sv[i * l.groups_per_row() + g] = scale[rows[i] * d.groups(o) + g0 + g];
      if (mn) mv[i * l.groups_per_row() + g] = mn->data<float>()[rows[i] * d.groups(o) + g0 + g];
    }
  }
  try {
    layer->set_int4_weight(Int4Weight::from_parts(l, std::move(v), std::move(sv), std::move(mv)));
  } catch (const InvalidArgument& e) {
    bad(q.file, w + ".scales", e.what());
  }
}

// The name of m's output head weight: the head module's "weight", or the embedding parameter a
// tied head shares.
std::string head_weight_name(CausalLM& m) {
  if (!m.output_head_name().empty()) return m.output_head_name() + ".weight";
  const Tensor& w = m.output_head_weight();
  for (auto& [n, t] : m.named_parameters())
    if (t.impl() == w.impl()) return n;
  throw CheckpointError("[quantized] the tied output head's weight is no parameter of the model");
}

// W.qweight, W.scales (and W.mins) of a quantized weight, as the file stores them.
void append_quantized(std::vector<std::pair<std::string, Tensor>>& out, const std::string& w,
                      const QuantizableLinear& layer) {
  if (const auto& w8 = layer.int8_weight()) {
    const auto* b = reinterpret_cast<const uint8_t*>(w8->values());
    out.emplace_back(w + ".qweight", pack_rows(b, w8->out_features(), w8->in_features()));
    out.emplace_back(w + ".scales", f32_rows(w8->scales(), w8->out_features(), 1));
    return;
  }
  const auto& w4 = *layer.int4_weight();
  const auto& l = w4.layout();
  out.emplace_back(w + ".qweight", pack_rows(w4.values(), l.n, l.bytes_per_row()));
  out.emplace_back(w + ".scales", f32_rows(w4.scales(), l.n, l.groups_per_row()));
  if (w4.mins()) out.emplace_back(w + ".mins", f32_rows(w4.mins(), l.n, l.groups_per_row()));
}

std::string metadata_value(const io::SafetensorsHeader& h, const fs::path& file,
                           const std::string& key) {
  const auto it = h.metadata.find(key);
  if (it == h.metadata.end())
    bad(file, key, "missing from the metadata (not a quantized nxd file)");
  return it->second;
}

}  // namespace

bool is_quantized_checkpoint(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::exists(dir / kQuantizedFile, ec);
}

QuantizedCheckpoint read_quantized_checkpoint(const fs::path& dir) {
  QuantizedCheckpoint q;
  q.file = dir / kQuantizedFile;
  io::SafetensorsReader r(q.file);
  const io::SafetensorsHeader& h = r.header();
  const std::string layout = metadata_value(h, q.file, kLayout);
  if (layout != "1" && layout != std::to_string(kQuantizedLayout))
    bad(q.file, kLayout,
        str("layout version '", layout.substr(0, 32), "', this nxd reads 1 and ",
            kQuantizedLayout));
  q.layout = layout == "2" ? 2 : 1;
  std::string spec = metadata_value(h, q.file, kFormat);
  if (spec == "int4") {
    const std::string zero = metadata_value(h, q.file, kZero);
    if (zero != "symmetric" && zero != "asymmetric")
      bad(q.file, kZero, str("'", zero.substr(0, 32), "' (symmetric or asymmetric)"));
    spec += ":" + metadata_value(h, q.file, kGroup) + (zero == "symmetric" ? ":sym" : ":asym");
  } else if (spec != "int8") {
    bad(q.file, kFormat, str("'", spec.substr(0, 32), "' (int8 or int4)"));
  }
  // layout 2: the output head quantized too, in the format nxd.quantized.head names
  const bool head = h.metadata.count(kHead) > 0;
  if (head != (layout == "2"))
    bad(q.file, kHead,
        head ? "present in a layout 1 file" : "missing (layout 2 quantizes the output head)");
  if (head) {
    const std::string hf = metadata_value(h, q.file, kHead);
    if (hf != "int8" && hf != "int4")
      bad(q.file, kHead, str("'", hf.substr(0, 32), "' (int8 or int4)"));
    spec += ":head=" + hf;
  }
  try {
    q.opts = parse_weight_quant(spec);
  } catch (const ConfigError& e) {
    bad(q.file, spec.rfind("int4", 0) == 0 ? kGroup : kFormat, e.what());
  }
  try {
    q.cfg = model_config_from_json(json::parse(metadata_value(h, q.file, kModelConfig)));
    for (const auto& n : json::parse(metadata_value(h, q.file, kLayers)))
      q.layers.push_back(n.get<std::string>());
  } catch (const json::exception& e) {
    bad(q.file, "metadata", e.what());
  }
  for (auto& [name, t] : r.read_all()) q.tensors[name] = t;
  return q;
}

void load_quantized_weights(CausalLM& m, const QuantizedCheckpoint& q) {
  const int64_t rank = parallel_state::model_parallel_is_initialized()
                           ? parallel_state::get_tensor_model_parallel_rank()
                           : 0;
  const std::map<std::string, Module*> layers = quantizable_layers(m);
  const std::set<std::string> listed(q.layers.begin(), q.layers.end());
  for (const auto& [w, mod] : layers)
    if (!listed.count(w)) bad(q.file, kLayers, str("does not list the model's layer ", w));
  std::map<std::string, ParallelParameter> params;
  for (auto& p : parallel_parameters(m)) params[p.name] = p;
  std::set<std::string> used;
  for (const std::string& w : q.layers) {
    const auto it = layers.find(w);
    if (it == layers.end() || !params.count(w))
      bad(q.file, kLayers, str("lists ", w, ", not a quantizable layer of the model"));
    set_layer(q, w, quantizable(it->second), q.opts, params.at(w), rank);
    release_quantized_weight(params.at(w).tensor);  // its values are never read (quantization.md)
    for (const char* part : {".qweight", ".scales", ".mins"}) used.insert(w + part);
  }
  // not read from the file: the quantized layers' parameter "weight", and an untied quantized
  // head's
  std::set<std::string> skip(listed);
  if (q.opts.head != WeightQuant::none) {
    const std::string hw = load_quantized_head(m, q);
    if (!m.output_head_tied()) skip.insert(hw);
    for (const char* part : {".qweight", ".scales", ".mins"}) used.insert(hw + part);
  }
  std::map<std::string, Tensor> rest;
  for (const auto& [name, t] : q.tensors)
    if (!used.count(name)) rest[name] = t;
  std::set<std::string> loaded(skip);
  for (auto& [n, t] : m.state_dict())
    if (!skip.count(n) && !rest.count(n)) bad(q.file, n, "missing");
  load_full_tensors({&m}, rest, q.file.string(), {.used = &loaded, .skip = &skip});
  for (const auto& [name, t] : rest)
    if (!loaded.count(name)) bad(q.file, name, "is not a tensor of the model");
}

std::string load_quantized_head(CausalLM& m, const QuantizedCheckpoint& q) {
  const int64_t rank = parallel_state::model_parallel_is_initialized()
                           ? parallel_state::get_tensor_model_parallel_rank()
                           : 0;
  const std::string hw = head_weight_name(m);
  for (auto& p : parallel_parameters(m))
    if (p.name == hw) {
      set_layer(q, hw, &m.output_head_weights(), with_format(q.opts, q.opts.head), p, rank);
      if (!m.output_head_tied()) release_quantized_weight(p.tensor);
      return hw;
    }
  bad(q.file, hw, "is not a parameter of the model");
}

QuantizeCheckpointReport quantize_checkpoint(const fs::path& tag_dir, const fs::path& out_dir,
                                             const QuantizeOptions& opts) {
  std::error_code ec;
  if (fs::exists(out_dir, ec) && (!fs::is_directory(out_dir, ec) || !fs::is_empty(out_dir, ec)))
    throw IoError(str("[nxd-ckpt] quantize: ", out_dir.string(),
                      " exists and is not an empty folder (not overwritten: remove it or choose "
                      "another OUT)"));
  if (opts.act != kernels::Int4Activations::f32)
    throw ConfigError(str("[quantize] ", describe(opts),
                          ": int8 activations (:q8) are chosen at load, not stored in a quantized "
                          "checkpoint; quantize without :q8"));
  const json meta = read_metadata(tag_dir);
  if (!meta.contains("model_config"))
    throw CheckpointError(str("[quantize] ", tag_dir.string(), " records no model_config"));
  if (meta.contains("lora"))
    throw ConfigError(str("[quantize] ", tag_dir.string(),
                          " holds LoRA adapters: merge them first (nxd-ckpt export-hf "
                          "--merge-lora, then import-hf) and quantize that checkpoint"));
  ModelConfig cfg = model_config_from_json(meta["model_config"]);
  cfg.sequence_parallel = false;
  cfg.dropout = 0.0;
  cfg.kv_size_multiplier = 1;
  std::map<std::string, Tensor> full;
  for (auto& [n, t] : read_merged_model(tag_dir)) full[n] = t;
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<std::string> names;
  QuantizeCheckpointReport rep;
  sim::launch(1, [&] {
    parallel_state::initialize_model_parallel(1);
    auto m = make_causal_lm(cfg, 0);
    load_full_tensors({m.get()}, full, tag_dir.string(), {.same_dtype = true});
    const QuantizedLmReport qr = quantize_causal_lm(*m, {}, opts);
    rep.summary = qr.summary;
    rep.head = qr.head;
    std::map<std::string, QuantizableLinear*> q;
    for (auto& [w, mod] : quantizable_layers(*m))
      if (quantizable(mod)->quantized()) q[w] = quantizable(mod);
    const bool head = opts.head != WeightQuant::none;
    const std::string hw = head ? head_weight_name(*m) : "";
    for (auto& [n, t] : m->state_dict()) {
      const auto it = q.find(n);
      if (it != q.end()) {
        names.push_back(n);
        append_quantized(out, n, *it->second);
        continue;
      }
      if (!(head && n == hw && !m->output_head_tied())) out.emplace_back(n, full.at(n));
      if (head && n == hw) append_quantized(out, n, m->output_head_weights());
    }
  });
  const bool head = opts.head != WeightQuant::none;
  std::map<std::string, std::string> md{{kLayout, head ? "2" : "1"},
                                        {kFormat, weight_quant_name(opts.format)},
                                        {kLayers, json(names).dump()},
                                        {kModelConfig, model_config_json(cfg).dump()}};
  if (is_int4(opts)) {
    md[kGroup] = std::to_string(opts.group);
    md[kZero] = asymmetric(opts) ? "asymmetric" : "symmetric";
  }
  if (head) md[kHead] = weight_quant_name(opts.head);
  fs::create_directories(out_dir);
  const io::WriteStats st = io::write_safetensors(out_dir / kQuantizedFile, out, md);
  rep.tensors = static_cast<int64_t>(out.size());
  rep.file_bytes = st.file_bytes;
  return rep;
}

QuantizedVerifyReport verify_quantized_checkpoint(const fs::path& dir) {
  const QuantizedCheckpoint q = read_quantized_checkpoint(dir);
  QuantizedVerifyReport r;
  r.tensors = static_cast<int64_t>(q.tensors.size());
  r.layers = static_cast<int64_t>(q.layers.size());
  r.bytes = static_cast<int64_t>(fs::file_size(q.file));
  r.format = describe(q.opts);
  ModelConfig cfg = q.cfg;
  cfg.validate();
  std::exception_ptr refused;  // the loader's own error (sim::launch would widen its type)
  sim::launch(1, [&] {
    parallel_state::initialize_model_parallel(1);
    auto m = make_causal_lm(cfg, 0);
    try {
      load_quantized_weights(*m, q);
    } catch (const CheckpointError&) {
      refused = std::current_exception();
    }
  });
  if (refused) std::rethrow_exception(refused);
  return r;
}

}  // namespace nxd::ckpt

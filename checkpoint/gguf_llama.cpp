// Llama models as GGUF files (gguf_llama.h).
#include "nxd/checkpoint/gguf_llama.h"

#include <cmath>
#include <cstring>
#include <set>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/error.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/io/bounded_read.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/runtime/kernels/gemv_int8.h"

namespace nxd::ckpt {

namespace fs = std::filesystem;
using io::GgmlType;
using io::GgufKV;
using io::GgufType;
using nlohmann::json;

namespace {

// One layer's tensors: nxd's (transformers') name suffix and GGUF's.
const std::pair<const char*, const char*> kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

// nxd name -> GGUF name, for every tensor of cfg's model.
std::vector<std::pair<std::string, std::string>> name_map(const ModelConfig& cfg) {
  std::vector<std::pair<std::string, std::string>> m = {
      {"model.embed_tokens.weight", "token_embd.weight"}};
  for (int64_t i = 0; i < cfg.num_layers; ++i)
    for (const auto& [nxd_name, gguf_name] : kLayerNames)
      m.push_back({str("model.layers.", i, ".", nxd_name), str("blk.", i, ".", gguf_name)});
  m.push_back({"model.norm.weight", "output_norm.weight"});
  if (!cfg.tie_word_embeddings) m.push_back({"lm_head.weight", "output.weight"});
  return m;
}

void check_covered(const ModelConfig& c, const std::string& source) {
  const auto refuse = [&](const std::string& what) {
    throw CheckpointError(str("[gguf] ", source, ": ", what,
                              " is not covered by nxd's GGUF mapping (Llama: dense, full rotary, "
                              "no rope scaling, no biases)"));
  };
  if (c.arch != "llama") refuse(str("architecture '", io::shorten(c.arch), "'"));
  if (c.moe.enabled()) refuse("a mixture of experts");
  if (c.rope_scaling.kind != RopeScaling::Kind::none) refuse("rope scaling");
  if (c.attention_bias || c.mlp_bias) refuse("attention or MLP biases");
}

Tensor permute_rows(const Tensor& w, int64_t heads, bool to_ggml) {
  const Tensor f = w.to(DType::f32).contiguous();
  const int64_t R = f.size(0), C = f.numel() / R, hd = R / heads;
  NXD_CHECK_SHAPE(heads > 0 && R % heads == 0 && hd % 2 == 0, "[gguf] cannot permute ", w.desc(),
                  " for ", heads, " heads (rows must be heads x an even head_dim)");
  Tensor out = empty(f.shape(), DType::f32);
  const float* in = f.data<float>();
  float* o = out.data<float>();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < hd / 2; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t half_split = h * hd + j * (hd / 2) + i, interleaved = h * hd + 2 * i + j;
        const int64_t src = to_ggml ? half_split : interleaved;
        const int64_t dst = to_ggml ? interleaved : half_split;
        std::memcpy(o + dst * C, in + src * C, static_cast<size_t>(C) * 4);
      }
  return out;
}

GgufKV kv(const std::string& key, GgufType t, json v, GgufType elem = GgufType::u32) {
  return GgufKV{key, t, elem, std::move(v)};
}

uint32_t file_type(GgmlType t) {  // llama_ftype: ALL_F32, MOSTLY_F16, _Q4_0, _Q8_0, _BF16
  switch (t) {
    case GgmlType::f32:
      return 0;
    case GgmlType::f16:
      return 1;
    case GgmlType::q4_0:
      return 2;
    case GgmlType::q8_0:
      return 7;
    case GgmlType::bf16:
      return 32;
  }
  return 0;
}

// tokenizer.ggml.* from a byte-level BPE tokenizer.json, padded to the model's vocabulary.
void tokenizer_kv(const std::string& path, int64_t vocab, std::vector<GgufKV>& out) {
  const json j = io::read_json_file(path, "tokenizer", "gguf");
  const json& m = j.contains("model") ? j["model"] : json();
  if (!m.is_object() || m.value("type", "") != "BPE" || !m.contains("vocab") ||
      !m["vocab"].is_object() || m.value("byte_fallback", false))
    throw CheckpointError(str("[gguf] ", path,
                              ": only a byte-level BPE tokenizer.json (GPT-2 style) goes into a "
                              "GGUF file here"));
  std::vector<std::string> tokens(static_cast<size_t>(vocab));
  std::vector<int32_t> types(static_cast<size_t>(vocab), 5);  // 5: unused
  const auto place = [&](int64_t id, const std::string& s, int32_t type) {
    if (id < 0 || id >= vocab)
      throw CheckpointError(
          str("[gguf] ", path, ": token id ", id, " outside the model's ", vocab, " ids"));
    tokens[id] = s;
    types[id] = type;
  };
  for (const auto& [piece, id] : m["vocab"].items())
    place(id.is_number_integer() ? id.get<int64_t>() : -1, piece, 1);
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const json& a : j["added_tokens"])
      place(a.value("id", int64_t{-1}), a.value("content", std::string()),
            a.value("special", false) ? 3 : 4);
  for (int64_t i = 0; i < vocab; ++i)
    if (types[i] == 5) tokens[i] = str("[PAD", i, "]");
  json merges = json::array();
  if (m.contains("merges") && m["merges"].is_array())
    for (const json& e : m["merges"])
      merges.push_back(e.is_string()
                           ? e.get<std::string>()
                           : e.at(0).get<std::string>() + " " + e.at(1).get<std::string>());
  out.push_back(kv("tokenizer.ggml.model", GgufType::string, "gpt2"));
  out.push_back(kv("tokenizer.ggml.pre", GgufType::string, "default"));
  out.push_back(kv("tokenizer.ggml.tokens", GgufType::array, tokens, GgufType::string));
  out.push_back(kv("tokenizer.ggml.token_type", GgufType::array, types, GgufType::i32));
  out.push_back(kv("tokenizer.ggml.merges", GgufType::array, merges, GgufType::string));
}

}  // namespace

Tensor permute_rotary_to_ggml(const Tensor& w, int64_t heads) {
  return permute_rows(w, heads, true);
}
Tensor permute_rotary_from_ggml(const Tensor& w, int64_t heads) {
  return permute_rows(w, heads, false);
}

GgufExportReport export_gguf(const fs::path& tag_dir, const fs::path& out,
                             const GgufExportOptions& opts) {
  std::error_code ec;
  if (fs::exists(out, ec))
    throw CheckpointError(str("[export-gguf] ", out.string(), " exists: nxd never overwrites it"));
  const json meta = read_metadata(tag_dir);
  if (!meta.contains("model_config"))
    throw CheckpointError(str("[export-gguf] ", tag_dir.string(), " records no model_config"));
  if (meta.contains("lora"))
    throw CheckpointError(str("[export-gguf] ", tag_dir.string(),
                              " has LoRA adapters: export-hf --merge-lora, import-hf, then "
                              "export-gguf the merged model"));
  const ModelConfig cfg = model_config_from_json(meta["model_config"]);
  check_covered(cfg, tag_dir.string());
  std::map<std::string, Tensor> full;
  for (auto& [n, t] : read_merged_model(tag_dir)) full[n] = t;
  std::vector<GgufKV> kvs = {
      kv("general.architecture", GgufType::string, "llama"),
      kv("general.name", GgufType::string, "nxd " + tag_dir.filename().string()),
      kv("general.file_type", GgufType::u32, file_type(opts.type)),
      kv("llama.vocab_size", GgufType::u32, cfg.vocab_size),
      kv("llama.context_length", GgufType::u32, cfg.max_position_embeddings),
      kv("llama.embedding_length", GgufType::u32, cfg.hidden_size),
      kv("llama.block_count", GgufType::u32, cfg.num_layers),
      kv("llama.feed_forward_length", GgufType::u32, cfg.ffn_hidden_size),
      kv("llama.rope.dimension_count", GgufType::u32, cfg.head_dim()),
      kv("llama.attention.head_count", GgufType::u32, cfg.num_attention_heads),
      kv("llama.attention.head_count_kv", GgufType::u32, cfg.kv_heads()),
      kv("llama.attention.layer_norm_rms_epsilon", GgufType::f32, cfg.norm_eps),
      kv("llama.rope.freq_base", GgufType::f32, cfg.rope_theta),
  };
  if (cfg.attention_head_dim > 0) {
    kvs.push_back(kv("llama.attention.key_length", GgufType::u32, cfg.head_dim()));
    kvs.push_back(kv("llama.attention.value_length", GgufType::u32, cfg.head_dim()));
  }
  if (opts.type == GgmlType::q8_0 || opts.type == GgmlType::q4_0)
    kvs.push_back(kv("general.quantization_version", GgufType::u32, 2));
  GgufExportReport rep;
  if (!opts.tokenizer.empty()) {
    tokenizer_kv(opts.tokenizer, cfg.vocab_size, kvs);
    rep.has_tokenizer = true;
  }
  std::vector<io::GgufWriteTensor> tensors;
  for (const auto& [nxd_name, gguf_name] : name_map(cfg)) {
    auto it = full.find(nxd_name);
    if (it == full.end())
      throw CheckpointError(str("[export-gguf] ", tag_dir.string(), " has no tensor ", nxd_name));
    Tensor t = it->second.to(DType::f32).contiguous();
    if (gguf_name.find("attn_q.") != std::string::npos)
      t = permute_rotary_to_ggml(t, cfg.num_attention_heads);
    if (gguf_name.find("attn_k.") != std::string::npos)
      t = permute_rotary_to_ggml(t, cfg.kv_heads());
    GgmlType type = t.dim() == 1 ? GgmlType::f32 : opts.type;
    if ((type == GgmlType::q8_0 || type == GgmlType::q4_0) && t.size(-1) % 32 != 0) {
      type = GgmlType::f16;
      ++rep.kept_f16;
    }
    tensors.push_back(
        {gguf_name, t.shape(), type, io::ggml_encode(type, t.data<float>(), t.numel())});
    full.erase(it);
  }
  if (!full.empty())
    throw CheckpointError(str("[export-gguf] ", tag_dir.string(), ": tensor ", full.begin()->first,
                              " has no GGUF name in nxd's Llama mapping"));
  io::write_gguf(out, kvs, tensors);
  rep.tensors = static_cast<int64_t>(tensors.size());
  rep.bytes = static_cast<int64_t>(fs::file_size(out));
  return rep;
}

namespace {

int64_t meta_int(const io::GgufFile& f, const std::string& key, int64_t lo, int64_t hi,
                 bool required = true, int64_t fallback = 0) {
  const GgufKV* e = f.find(key);
  if (!e) {
    if (required) throw CheckpointError(str("[gguf] ", f.path, ": metadata ", key, " is missing"));
    return fallback;
  }
  if (!e->value.is_number_integer())
    throw CheckpointError(str("[gguf] ", f.path, ": metadata ", key, " is not an integer"));
  const int64_t v = e->value.is_number_unsigned() && e->value.get<uint64_t>() > INT64_MAX
                        ? INT64_MAX
                        : e->value.get<int64_t>();
  if (v < lo || v > hi)
    throw CheckpointError(
        str("[gguf] ", f.path, ": metadata ", key, " is ", v, ", outside [", lo, ", ", hi, "]"));
  return v;
}

double meta_float(const io::GgufFile& f, const std::string& key, double fallback) {
  const GgufKV* e = f.find(key);
  if (!e) return fallback;
  if (!e->value.is_number() || !std::isfinite(e->value.get<double>()) ||
      e->value.get<double>() <= 0)
    throw CheckpointError(str("[gguf] ", f.path, ": metadata ", key, " must be a positive number"));
  return e->value.get<double>();
}

}  // namespace

GgufModel read_gguf_model(const fs::path& file) {
  const io::GgufFile f = io::read_gguf(file);
  const GgufKV* arch = f.find("general.architecture");
  if (!arch || !arch->value.is_string())
    throw CheckpointError(str("[gguf] ", f.path, ": no general.architecture"));
  GgufModel m;
  ModelConfig& c = m.cfg;
  c.arch = arch->value.get<std::string>();
  check_covered(c, f.path);
  c.num_layers = meta_int(f, "llama.block_count", 1, 4096);
  c.hidden_size = meta_int(f, "llama.embedding_length", 1, 1 << 20);
  c.ffn_hidden_size = meta_int(f, "llama.feed_forward_length", 1, 1 << 22);
  c.num_attention_heads = meta_int(f, "llama.attention.head_count", 1, 1 << 12);
  c.num_kv_heads = meta_int(f, "llama.attention.head_count_kv", 1, c.num_attention_heads, false,
                            c.num_attention_heads);
  c.max_position_embeddings = meta_int(f, "llama.context_length", 1, 1 << 24);
  const int64_t key_len = meta_int(f, "llama.attention.key_length", 2, 1 << 16, false, 0);
  if (key_len > 0 && key_len != c.hidden_size / c.num_attention_heads)
    c.attention_head_dim = key_len;
  const int64_t rot = meta_int(f, "llama.rope.dimension_count", 2, 1 << 16, false, c.head_dim());
  if (rot != c.head_dim())
    throw CheckpointError(str("[gguf] ", f.path, ": llama.rope.dimension_count ", rot,
                              " is not the head dimension ", c.head_dim(),
                              " (partial rotary is not covered)"));
  for (const GgufKV& e : f.kv)
    if (e.key.rfind("llama.rope.scaling", 0) == 0)
      throw CheckpointError(str("[gguf] ", f.path, ": ", e.key,
                                ": rope scaling is not covered by nxd's GGUF mapping"));
  c.norm_eps = meta_float(f, "llama.attention.layer_norm_rms_epsilon", 1e-5);
  c.rope_theta = meta_float(f, "llama.rope.freq_base", 10000.0);
  c.rotary_pct = 1.0;
  c.init_std = 0.02;
  const io::GgufTensor* emb = f.tensor("token_embd.weight");
  if (!emb || emb->shape.size() != 2 || emb->shape[1] != c.hidden_size)
    throw CheckpointError(
        str("[gguf] ", f.path, ": token_embd.weight missing or not [vocab, ", c.hidden_size, "]"));
  c.vocab_size = emb->shape[0];
  c.tie_word_embeddings = f.tensor("output.weight") == nullptr;
  try {
    c.validate();
  } catch (const Error& e) {
    throw CheckpointError(str("[gguf] ", f.path, ": ", e.what()));
  }
  std::set<std::string> expected;
  for (const auto& [nxd_name, gguf_name] : name_map(c)) expected.insert(gguf_name);
  for (const io::GgufTensor& t : f.tensors)
    if (!expected.count(t.name))
      throw CheckpointError(str("[gguf] ", f.path, ": tensor ", io::shorten(t.name),
                                " is not part of nxd's Llama mapping (rope_freqs.weight: rope "
                                "scaling, not covered)"));
  // each tensor's expected shape, from a model built on meta tensors
  ModelConfig meta_cfg = c;
  meta_cfg.device = Device::meta;
  std::map<std::string, Shape> shapes;
  for (auto& [n, p] : make_causal_lm(meta_cfg, 0)->named_parameters()) shapes[n] = p.shape();
  std::string types;
  for (const auto& [nxd_name, gguf_name] : name_map(c)) {
    const io::GgufTensor* t = f.tensor(gguf_name);
    if (!t) throw CheckpointError(str("[gguf] ", f.path, ": tensor ", gguf_name, " is missing"));
    const Shape& want = shapes.at(nxd_name);
    if (t->shape != want)
      throw CheckpointError(str("[gguf] ", f.path, ": tensor ", gguf_name, " is ",
                                shape_str(t->shape), ", the model needs ", shape_str(want)));
    std::vector<float> v = io::read_gguf_f32(f, *t);
    Tensor x = from_vector<float>(v, want);
    if (gguf_name.find("attn_q.") != std::string::npos)
      x = permute_rotary_from_ggml(x, c.num_attention_heads);
    if (gguf_name.find("attn_k.") != std::string::npos)
      x = permute_rotary_from_ggml(x, c.kv_heads());
    m.full[nxd_name] = x;
    if (nxd_name == (c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight")) {
      m.head_name = nxd_name;
      m.head_type = static_cast<GgmlType>(t->type);  // read above: one of the decoded types
      if (m.head_type == GgmlType::q8_0 || m.head_type == GgmlType::q4_0)
        m.head_bytes = io::read_gguf_bytes(f, *t);
    }
    if (types.find(io::ggml_type_name(t->type)) == std::string::npos)
      types += std::string(types.empty() ? "" : "/") + io::ggml_type_name(t->type);
  }
  m.description = str("llama, ", c.num_layers, " layers, hidden ", c.hidden_size, ", ", types);
  return m;
}

std::shared_ptr<const QuantizedCheckpoint> gguf_quantized_head(const GgufModel& g,
                                                               const std::string& file) {
  if (g.head_type != GgmlType::q8_0 && g.head_type != GgmlType::q4_0) return nullptr;
  const Tensor& full = g.full.at(g.head_name);
  const int64_t V = full.size(0), H = full.size(1);
  auto q = std::make_shared<QuantizedCheckpoint>();
  q->file = file;
  q->cfg = g.cfg;
  const std::string w = g.head_name;
  if (g.head_type == GgmlType::q4_0) {
    q->opts = parse_weight_quant("int4:32:sym:head=int4");
    const int64_t blocks = H / 32;  // a q4_0 tensor's rows are whole blocks
    NXD_CHECK(static_cast<int64_t>(g.head_bytes.size()) == V * blocks * 18, "[gguf] ", file, ": ",
              w, " holds ", g.head_bytes.size(), " bytes, q4_0 [", V, ", ", H, "] needs ",
              V * blocks * 18);
    Tensor qw = zeros({V, blocks * 4}, DType::i32), sc = empty({V, blocks}, DType::f32);
    auto* dst = static_cast<uint8_t*>(qw.raw_data());
    for (int64_t r = 0; r < V; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = g.head_bytes.data() + (r * blocks + b) * 18;  // f16 d, 16 code bytes
        sc.data<float>()[r * blocks + b] =
            io::f16_to_f32(static_cast<uint16_t>(blk[0] | blk[1] << 8));
        std::memcpy(dst + (r * blocks + b) * 16, blk + 2, 16);
      }
    q->tensors[w + ".qweight"] = qw;
    q->tensors[w + ".scales"] = sc;
  } else {
    q->opts = parse_weight_quant("int8:head=int8");
    const Tensor wf = full.contiguous();
    std::vector<int8_t> v(static_cast<size_t>(V * H));
    Tensor sc = empty({V, 1}, DType::f32);
    kernels::quantize_int8_rows(v.data(), sc.data<float>(), wf.data<float>(), V, H);
    Tensor qw = zeros({V, (H + 3) / 4}, DType::i32);
    for (int64_t r = 0; r < V; ++r)
      std::memcpy(static_cast<uint8_t*>(qw.raw_data()) + r * ((H + 3) / 4) * 4, v.data() + r * H,
                  static_cast<size_t>(H));
    q->tensors[w + ".qweight"] = qw;
    q->tensors[w + ".scales"] = sc;
  }
  return q;
}

void import_gguf(const fs::path& file, const fs::path& out_root, const std::string& tag, int tp,
                 int dp) {
  GgufModel m = read_gguf_model(file);
  import_full_tensors(m.full, file.string(), m.cfg, out_root, tag, tp, dp);
}

}  // namespace nxd::ckpt

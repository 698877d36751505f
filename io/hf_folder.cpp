// The files of a transformers folder: config.json as JSON, plain safetensors (F32/F16/BF16, one
// file or shards through model.safetensors.index.json) cast to f32, and rope_scaling.
#include "nxd/io/hf_folder.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include "nxd/io/bounded_read.h"
#include "nxd/io/fileio.h"

namespace nxd::io {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderBytes = 100 << 20;  // the safetensors library's own limit
constexpr int64_t kMaxJsonBytes = 16 << 20;      // config.json, model.safetensors.index.json

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

// One tensor entry of a transformers safetensors header, validated.
struct HfEntry {
  std::string name, dtype;
  Shape shape;
  int64_t begin = 0, end = 0, numel = 1;
};

// The header's tensors (all but __metadata__, or only those in `only`), each checked before
// anything is sized by it: a JSON object per tensor, dtype F32/F16/BF16, non-negative dims,
// offsets matching shape x dtype size inside the data section, no two tensors overlapping.
std::vector<HfEntry> hf_entries(const json& h, const std::string& file, int64_t data_size,
                                const std::set<std::string>* only) {
  if (!h.is_object()) throw FileError(str("[import-hf] ", file, ": header is not a JSON object"));
  std::vector<HfEntry> out;
  for (const auto& [name, e] : h.items()) {
    if (name == "__metadata__" || (only && !only->count(name))) continue;
    const std::string at = str("[import-hf] ", file, ": tensor '", shorten(name), "'");
    HfEntry t{.name = name};
    try {
      t.dtype = e.at("dtype").get<std::string>();
      for (const json& d : e.at("shape")) t.shape.push_back(d.get<int64_t>());
      const json& off = e.at("data_offsets");
      if (!off.is_array() || off.size() != 2) throw FileError(str(at, " has no [begin, end]"));
      t.begin = off[0].get<int64_t>();
      t.end = off[1].get<int64_t>();
    } catch (const json::exception& ex) {
      throw FileError(str(at, ": malformed entry ", shorten(e.dump()), " (", ex.what(), ")"));
    }
    const int64_t size = t.dtype == "F32" ? 4 : (t.dtype == "F16" || t.dtype == "BF16") ? 2 : 0;
    if (size == 0)
      throw FileError(str(at, " is ", shorten(t.dtype), " (F32, F16 and BF16 are read)"));
    for (int64_t d : t.shape) {
      if (d < 0 || (d > 0 && t.numel > data_size / d))
        throw FileError(str(at, " has shape ", shape_str(t.shape), ", larger than the file"));
      t.numel *= d;
    }
    if (t.begin < 0 || t.end < t.begin || t.end > data_size || t.end - t.begin != t.numel * size)
      throw FileError(str(at, " ", t.dtype, shape_str(t.shape), " has data offsets [", t.begin,
                          ", ", t.end, "] outside the file or of the wrong size (data ", data_size,
                          " bytes)"));
    out.push_back(std::move(t));
  }
  std::vector<const HfEntry*> by_offset;
  for (const HfEntry& t : out) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const HfEntry* x, const HfEntry* y) { return x->begin < y->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end && by_offset[i]->numel > 0)
      throw FileError(str("[import-hf] ", file, ": tensors '", shorten(by_offset[i - 1]->name),
                          "' and '", shorten(by_offset[i]->name), "' overlap"));
  return out;
}

// `t`'s bytes cast to f32; FileError naming the tensor at its first NaN or infinity (a broken
// file: transformers would load it and generate garbage).
Tensor hf_tensor_f32(const HfEntry& t, const std::vector<char>& buf, const std::string& file) {
  Tensor out = empty(t.shape, DType::f32);
  float* d = out.data<float>();
  for (int64_t i = 0; i < t.numel; ++i) {
    if (t.dtype == "F32") {
      std::memcpy(&d[i], buf.data() + 4 * i, 4);
    } else {
      uint16_t v;
      std::memcpy(&v, buf.data() + 2 * i, 2);
      if (t.dtype == "F16") {
        d[i] = half_to_float(v);
      } else {
        const uint32_t bits = static_cast<uint32_t>(v) << 16;
        std::memcpy(&d[i], &bits, 4);
      }
    }
    if (!std::isfinite(d[i]))
      throw FileError(str("[import-hf] ", file, ": tensor '", shorten(t.name), "' holds ", d[i],
                          " at element ", i, " (a weight must be finite)"));
  }
  return out;
}

// One transformers safetensors file, every tensor cast to f32 into `out`. HF files carry no
// checksums; the header is checked against the file before anything is sized by it.
void read_hf_file(const fs::path& file, std::map<std::string, Tensor>& out,
                  const std::set<std::string>* only = nullptr) {
  const std::string name = file.string();
  const int fd = open_regular_file(name, "safetensors file", "import-hf");
  std::ifstream in(file, std::ios::binary);
  ::close(fd);
  if (!in) throw FileError(str("[import-hf] cannot read ", name));
  const auto file_size = static_cast<int64_t>(fs::file_size(file));
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (!in || n > static_cast<uint64_t>(file_size) - 8 || n > kMaxHeaderBytes)
    throw FileError(str("[import-hf] ", name, " is not a safetensors file (header length ", n,
                        ", file ", file_size, " bytes)"));
  std::string head(n, '\0');
  in.read(head.data(), static_cast<std::streamsize>(n));
  json h;
  try {
    check_flow_depth(head, /*yaml=*/false, name, "import-hf");
    h = json::parse(head);
  } catch (const std::exception& e) {
    throw FileError(str("[import-hf] ", name, ": bad header: ", shorten(e.what(), 200)));
  }
  const int64_t data_start = 8 + static_cast<int64_t>(n);
  std::vector<char> buf;
  for (const HfEntry& t : hf_entries(h, name, file_size - data_start, only)) {
    buf.resize(static_cast<size_t>(t.end - t.begin));
    in.seekg(data_start + t.begin);
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (!in) throw FileError(str("[import-hf] ", name, ": cannot read '", shorten(t.name), "'"));
    out[t.name] = hf_tensor_f32(t, buf, name);
  }
}

[[noreturn]] void refuse(const std::string& what) {
  throw FileError(str("[import-hf] config.json: ", what, " is not supported by nxd's model"));
}

}  // namespace

bool is_hf_folder(const fs::path& dir) {
  return fs::is_regular_file(dir / "config.json") &&
         (fs::is_regular_file(dir / "model.safetensors") ||
          fs::is_regular_file(dir / "model.safetensors.index.json"));
}

json read_hf_config_json(const fs::path& hf_dir) {
  return read_json_file((hf_dir / "config.json").string(), "config.json", "import-hf",
                        kMaxJsonBytes);
}

std::map<std::string, Tensor> read_hf_tensors(const fs::path& hf_dir,
                                              std::vector<std::string>* notes) {
  std::map<std::string, Tensor> w;
  const fs::path index = hf_dir / "model.safetensors.index.json";
  if (fs::is_regular_file(hf_dir / "model.safetensors")) {
    read_hf_file(hf_dir / "model.safetensors", w);
  } else if (fs::is_regular_file(index)) {
    std::map<std::string, std::set<std::string>> by_file;
    try {
      const json j = read_json_file(index.string(), "index", "import-hf", kMaxJsonBytes);
      for (const auto& [name, f] : j.at("weight_map").items())
        by_file[f.get<std::string>()].insert(name);
    } catch (const FileError&) {
      throw;
    } catch (const std::exception& e) {
      throw FileError(str("[import-hf] ", index.string(), ": ", e.what()));
    }
    for (const auto& [f, names] : by_file) {
      if (f.find('/') != std::string::npos || f == ".." || !fs::is_regular_file(hf_dir / f))
        throw FileError(str("[import-hf] ", index.string(), " lists shard '", f,
                            "', which is not a file of ", hf_dir.string()));
      const size_t before = w.size();
      read_hf_file(hf_dir / f, w, &names);
      if (w.size() - before != names.size())
        for (const auto& n : names)
          if (!w.count(n))
            throw FileError(str("[import-hf] ", (hf_dir / f).string(), " has no tensor '", n,
                                "' (listed in ", index.string(), ")"));
    }
    if (notes)
      notes->push_back(str("read ", by_file.size(), " shard(s) listed in ", index.string()));
  } else {
    throw FileError(str("[import-hf] ", hf_dir.string(),
                        " has neither model.safetensors nor model.safetensors.index.json"));
  }
  return w;
}

// rope_scaling: null, or of type linear (factor) or llama3 (factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings); other types (dynamic, yarn, longrope, ...)
// are refused. transformers names the type "rope_type" (older: "type").
RopeScaling read_rope_scaling(const json& j) {
  RopeScaling s;
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return s;
  const json& r = j["rope_scaling"];
  std::string type = "?";
  if (r.is_object()) type = r.value("rope_type", r.value("type", std::string("?")));
  if (type == "default") return s;
  if (type == "linear") {
    s.kind = RopeScaling::Kind::linear;
    s.factor = r.at("factor").get<double>();
  } else if (type == "llama3") {
    s.kind = RopeScaling::Kind::llama3;
    s.factor = r.at("factor").get<double>();
    s.low_freq_factor = r.at("low_freq_factor").get<double>();
    s.high_freq_factor = r.at("high_freq_factor").get<double>();
    s.original_max_position_embeddings = r.at("original_max_position_embeddings").get<int64_t>();
  } else {
    refuse(str("rope_scaling of type '", shorten(type), "' (", shorten(r.dump()),
               "; linear and llama3 are)"));
  }
  return s;
}

json rope_scaling_json(const RopeScaling& s) {
  switch (s.kind) {
    case RopeScaling::Kind::linear:
      return {{"rope_type", "linear"}, {"factor", s.factor}};
    case RopeScaling::Kind::llama3:
      return {{"rope_type", "llama3"},
              {"factor", s.factor},
              {"low_freq_factor", s.low_freq_factor},
              {"high_freq_factor", s.high_freq_factor},
              {"original_max_position_embeddings", s.original_max_position_embeddings}};
    case RopeScaling::Kind::none:
      break;
  }
  return nullptr;
}

}  // namespace nxd::io

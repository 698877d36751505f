// The files of a transformers folder: config.json as JSON, plain safetensors (F32/F16/BF16, one
// file or shards through model.safetensors.index.json) cast to f32, and rope_scaling.
#include "nxd/io/hf_folder.h"

#include <cstring>
#include <fstream>
#include <set>

#include "nxd/io/fileio.h"

namespace nxd::io {
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
  if (!in) throw FileError(str("[import-hf] cannot read ", file.string()));
  const auto file_size = static_cast<int64_t>(fs::file_size(file));
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (!in || static_cast<int64_t>(n) > file_size - 8)
    throw FileError(str("[import-hf] ", file.string(), " is not a safetensors file"));
  std::string head(n, '\0');
  in.read(head.data(), static_cast<std::streamsize>(n));
  json h;
  try {
    h = json::parse(head);
  } catch (const std::exception& e) {
    throw FileError(str("[import-hf] ", file.string(), ": bad header: ", e.what()));
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
      throw FileError(str("[import-hf] ", file.string(), ": tensor '", name, "' is ", dt,
                          " (F32, F16 and BF16 are read)"));
    if (off.size() != 2 || off[1] - off[0] != numel * size || off[0] < 0 ||
        data_start + off[1] > file_size)
      throw FileError(str("[import-hf] ", file.string(), ": tensor '", name, "' ", dt,
                          shape_str(shape), " has data offsets ", e["data_offsets"].dump(),
                          " outside the file or of the wrong size (file ", file_size, " bytes)"));
    buf.resize(static_cast<size_t>(numel * size));
    in.seekg(data_start + off[0]);
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (!in) throw FileError(str("[import-hf] ", file.string(), ": cannot read '", name, "'"));
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
  const fs::path f = hf_dir / "config.json";
  try {
    return json::parse(read_file(f));
  } catch (const FileError&) {
    throw;
  } catch (const std::exception& e) {
    throw FileError(str("[import-hf] ", f.string(), ": ", e.what()));
  }
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
      const json j = json::parse(read_file(index));
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
    refuse(str("rope_scaling of type '", type, "' (", r.dump(), "; linear and llama3 are)"));
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

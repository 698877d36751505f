#pragma once
// GGUF, the file format of llama.cpp and the ggml family (version 3; the format is specified in
// ggml's docs/gguf.md): a header, typed key/value metadata, tensor descriptions, then the tensor
// data, each tensor at an offset aligned to general.alignment (default 32).
//
// The reader is hostile-input safe like the safetensors reader: every count, string length,
// array length, dimension and offset is checked against the file's size and fixed limits before
// it sizes anything; tensors must lie inside the data section, aligned, without overlapping.
// Refusals are IoError naming the file and what is wrong. Tensor data types: F32, F16, BF16,
// Q8_0 and Q4_0 (ggml's reference codecs below, bit for bit); any other type is refused by name
// when its data is read.
//
// Shapes: GGUF lists dimensions innermost first (ne[0] is the contiguous one); GgufTensor::shape
// is in nxd's (row-major) order, the reverse.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace nxd::io {

enum class GgufType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

// ggml tensor types nxd reads and writes (ggml's numbering).
enum class GgmlType : uint32_t { f32 = 0, f16 = 1, q4_0 = 2, q8_0 = 8, bf16 = 30 };
const char* ggml_type_name(uint32_t type);  // "q4_K" etc. for any type ggml knows, else "?"
GgmlType ggml_type_from_name(const std::string& name);  // f32|f16|bf16|q8_0|q4_0, else ConfigError

// One metadata entry: its type (and an array's element type) and the value as JSON (numbers,
// bool, string, or an array of them).
struct GgufKV {
  std::string key;
  GgufType type = GgufType::u32;
  GgufType elem = GgufType::u32;  // arrays
  nlohmann::json value;
};

struct GgufTensor {
  std::string name;
  std::vector<int64_t> shape;  // nxd order (outermost first)
  uint32_t type = 0;           // a ggml type (maybe one nxd does not decode)
  uint64_t offset = 0;         // from the start of the data section
  int64_t nbytes = 0;
  int64_t numel() const;
};

struct GgufFile {
  std::string path;
  uint32_t version = 3;
  uint64_t alignment = 32;
  uint64_t data_offset = 0;  // of the data section in the file
  std::vector<GgufKV> kv;
  std::vector<GgufTensor> tensors;
  const GgufKV* find(const std::string& key) const;  // null when absent
  const GgufTensor* tensor(const std::string& name) const;
};

// The header, metadata and tensor descriptions of a GGUF file (the data is not read).
GgufFile read_gguf(const std::filesystem::path& path);
// A tensor's data decoded to f32 (F32, F16, BF16, Q8_0, Q4_0; IoError naming the tensor's type
// otherwise), in the tensor's shape, row-major.
std::vector<float> read_gguf_f32(const GgufFile& f, const GgufTensor& t);
// A tensor's raw bytes.
std::vector<uint8_t> read_gguf_bytes(const GgufFile& f, const GgufTensor& t);

// Writes a GGUF file (version 3, alignment 32) atomically; tensors' bytes as given.
struct GgufWriteTensor {
  std::string name;
  std::vector<int64_t> shape;  // nxd order
  GgmlType type = GgmlType::f32;
  std::vector<uint8_t> bytes;
};
void write_gguf(const std::filesystem::path& path, const std::vector<GgufKV>& kv,
                const std::vector<GgufWriteTensor>& tensors);

// ---- ggml's codecs (reference implementations: ggml-quants.c quantize_row_*_ref) ----
// Bytes of n values of `type` (n a multiple of 32 for the block types).
int64_t ggml_nbytes(GgmlType type, int64_t n);
// f32 values x[0..n) into `type`'s bytes; Q8_0/Q4_0 need n % 32 == 0 (InvalidArgument).
std::vector<uint8_t> ggml_encode(GgmlType type, const float* x, int64_t n);
void ggml_decode(GgmlType type, const uint8_t* bytes, int64_t n, float* out);
uint16_t f32_to_f16(float x);  // round to nearest even, as F16C
float f16_to_f32(uint16_t h);

}  // namespace nxd::io

#pragma once
// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {str: str}} (padded with spaces to a multiple of 8), then the tensors' raw
// little-endian bytes, offsets relative to the end of the header, packed without gaps.
//
// nxd writes dtypes F32, BF16, F64, I32, I64, tensors in the order given, "format": "pt" in the
// metadata (what Hugging Face transformers expects) and one checksum per tensor,
// "nxd.crc32c.<name>": CRC-32C of its bytes as 8 hex digits, verified by every read. An
// uncompressed file opens in any safetensors reader. A compressed file is the same bytes in one
// zstd frame (`zstd -d` gives the plain file); readers detect it by the zstd magic number.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nxd/io/fileio.h"
#include "nxd/runtime/tensor.h"

namespace nxd::io {

const char* safetensors_dtype(DType t);  // "F32", "BF16", ...

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  int64_t begin = 0, end = 0;   // byte offsets in the data section
  std::optional<uint32_t> crc;  // from "nxd.crc32c.<name>"
  int64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;              // in data (offset) order
  std::map<std::string, std::string> metadata;  // __metadata__ without the checksum keys
  int64_t data_start = 0;                       // 8 + header length
  int64_t data_size = 0;                        // end of the last tensor
  const TensorInfo* find(const std::string& name) const;
};

// The header bytes (length prefix and padded JSON) for `tensors` packed in order; crcs[i] is
// tensor i's checksum.
std::string encode_header(const std::vector<std::pair<std::string, Tensor>>& tensors,
                          const std::vector<uint32_t>& crcs,
                          const std::map<std::string, std::string>& metadata);
// Parses and validates the JSON header (`file` names the source in errors): known dtypes,
// non-negative shapes, offsets matching shape x dtype size, tensors packed from 0 without gaps or
// overlaps, string metadata, well-formed checksums. FileError naming file and tensor.
SafetensorsHeader parse_header(const std::string& json, const std::string& file);

struct SafetensorsWriteOptions {
  bool compress = false;  // one zstd frame
  int zstd_level = 1;
  bool sync = true;  // fsync before the rename
};

struct WriteStats {
  int64_t data_bytes = 0;  // the tensors' bytes
  int64_t file_bytes = 0;  // on disk
};

// Writes host tensors (any strides; meta tensors are rejected) to `path` atomically (AtomicFile).
// Names must be unique and not "__metadata__".
WriteStats write_safetensors(const std::filesystem::path& path,
                             const std::vector<std::pair<std::string, Tensor>>& tensors,
                             const std::map<std::string, std::string>& metadata = {},
                             const SafetensorsWriteOptions& opts = {});

class SafetensorsReader {
 public:
  // Opens the file and reads and validates its header (FileError naming the file).
  explicit SafetensorsReader(const std::filesystem::path& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const SafetensorsHeader& header() const { return header_; }
  const std::filesystem::path& path() const { return path_; }
  bool compressed() const { return compressed_; }
  int64_t file_size() const { return file_size_; }

  // Streams the data section once, in file order: for each tensor, sink(info) returns where its
  // nbytes() go (nullptr: skip it). Every tensor read is checked against its checksum. Truncation,
  // corruption or a checksum mismatch throw FileError naming the file and the tensor.
  void read(const std::function<void*(const TensorInfo&)>& sink);
  // Every tensor as a new host tensor, in file order.
  std::vector<std::pair<std::string, Tensor>> read_all();

 private:
  struct Source;
  std::filesystem::path path_;
  std::unique_ptr<Source> src_;
  SafetensorsHeader header_;
  bool compressed_ = false;
  bool consumed_ = false;
  int64_t file_size_ = 0;
};

}  // namespace nxd::io

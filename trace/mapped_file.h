#pragma once
// A read-only private mapping of a whole file (copy-on-write if written), shared by the tensors
// that view it.
#include <cstdint>
#include <filesystem>
#include <memory>

namespace nxd::trace {

class MappedFile {
 public:
  // TraceError naming the file when it cannot be opened or mapped.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return static_cast<const char*>(data_); }
  char* mutable_data() const { return static_cast<char*>(data_); }
  int64_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace nxd::trace

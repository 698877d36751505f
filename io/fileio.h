#pragma once
// Durable file writes (checkpoints, traces, exported folders): every file is written to a
// temporary name in its final folder, fsync'd, renamed over the final name and the folder
// fsync'd, so a reader (or a crash at any moment) sees either no file or the whole file, never
// part of one.
#include <cstdint>
#include <filesystem>
#include <string>

#include "nxd/runtime/error.h"

namespace nxd::io {

// A file (checkpoint shard, safetensors file, transformers folder, trace) that cannot be read or
// written as expected (truncated, corrupted, missing, mismatched). A user-visible condition: tools
// exit with code 2. checkpoint/ calls it CheckpointError.
class FileError : public IoError {
 public:
  using IoError::IoError;
};

// Writes a file at `path` through a temporary (path + ".tmp.<pid>.<n>"). commit() makes it
// durable and visible; destroying an uncommitted writer removes the temporary.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path, bool sync = true);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);  // all of it, or FileError naming the file
  int64_t bytes_written() const { return written_; }
  void commit();  // fsync, rename over path, fsync the folder
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_, tmp_;
  int fd_ = -1;
  bool sync_;
  int64_t written_ = 0;
};

// The whole of `content` as the file `path`, atomically.
void write_file_atomic(const std::filesystem::path& path, const std::string& content,
                       bool sync = true);
// The whole of a regular file of at most max_bytes (FileError naming it otherwise: missing,
// unreadable, a FIFO or device, too large).
std::string read_file(const std::filesystem::path& path, int64_t max_bytes = int64_t{1} << 30);
// fsync of a folder (makes renames and removals in it durable); errors are ignored where the
// file system does not support it.
void fsync_dir(const std::filesystem::path& dir);

}  // namespace nxd::io

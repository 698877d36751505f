#include "nxd/io/fileio.h"

#include "nxd/io/bounded_read.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace nxd::io {
namespace fs = std::filesystem;

namespace {
std::string temp_name(const fs::path& p) {
  static std::atomic<uint64_t> counter{0};
  return p.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}
}  // namespace

AtomicFile::AtomicFile(fs::path path, bool sync)
    : path_(std::move(path)), tmp_(temp_name(path_)), sync_(sync) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw FileError(
        str("[checkpoint] cannot create '", tmp_.string(), "': ", std::strerror(errno)));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      throw FileError(str("[checkpoint] write to '", tmp_.string(),
                          "' failed: ", w < 0 ? std::strerror(errno) : "no progress"));
    p += w;
    n -= static_cast<size_t>(w);
    written_ += w;
  }
}

void AtomicFile::commit() {
  NXD_CHECK_T(InternalError, fd_ >= 0, "[checkpoint] '", path_.string(), "' committed twice");
  if (sync_ && ::fsync(fd_) != 0)
    throw FileError(
        str("[checkpoint] fsync of '", tmp_.string(), "' failed: ", std::strerror(errno)));
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp_.c_str());
    throw FileError(str("[checkpoint] rename '", tmp_.string(), "' -> '", path_.string(),
                        "' failed: ", std::strerror(e)));
  }
  if (sync_) fsync_dir(path_.parent_path());
}

void write_file_atomic(const fs::path& path, const std::string& content, bool sync) {
  AtomicFile f(path, sync);
  f.write(content.data(), content.size());
  f.commit();
}

std::string read_file(const fs::path& path, int64_t max_bytes) {
  try {  // regular files only (a FIFO would block), at most max_bytes
    return read_regular_file(path.string(), "", max_bytes, "checkpoint");
  } catch (const IoError& e) {
    throw FileError(e.what());
  }
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace nxd::io

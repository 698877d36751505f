// Fuzz target for the safetensors reader (header parser, checksums, zstd frames): any input must
// either read or throw FileError; anything else (a crash, another exception, a sanitizer
// report) is a bug. The libFuzzer entry point (NXD_FUZZ, tests/CMakeLists.txt); every
// build drives it with fuzz_safetensors_replay.cpp over deterministic mutations of valid files.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "nxd/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace nxd::io;
  try {
    (void)parse_header(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const FileError&) {
  }
  static const int fd = memfd_create("nxd_fuzz", 0);
  if (fd < 0) return 0;
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    SafetensorsReader r(path);
    std::vector<char> buf;
    r.read([&](const TensorInfo& t) -> void* {
      if (t.nbytes() > (int64_t{64} << 20)) return nullptr;  // skipped, not allocated
      buf.resize(static_cast<size_t>(t.nbytes()) + 1);
      return buf.data();
    });
  } catch (const FileError&) {
  }
  return 0;
}

// Fuzz target for the checkpoint metadata reader (parse_metadata, checkpoint/metadata.h): any
// input must either parse into validated metadata or throw CheckpointError; anything else (a
// crash, another exception, a sanitizer report) is a bug. Built with NXD_FUZZ_METADATA_ENTRY it
// is libFuzzer's entry point (NXD_FUZZ, tests/checkpoint/CMakeLists.txt); every build drives it
// from fuzz_replay.cpp, where inputs that parse are also loaded as a real checkpoint's metadata.
#include <cstddef>
#include <cstdint>
#include <string>

#include "nxd/checkpoint/error.h"
#include "nxd/checkpoint/metadata.h"

extern "C" int nxd_fuzz_metadata(const uint8_t* data, size_t size) {
  try {
    (void)nxd::ckpt::parse_metadata(std::string(reinterpret_cast<const char*>(data), size),
                                    "fuzz/metadata.json");
    return 1;
  } catch (const nxd::ckpt::CheckpointError&) {
  }
  return 0;
}

#ifdef NXD_FUZZ_METADATA_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)nxd_fuzz_metadata(data, size);
  return 0;
}
#endif

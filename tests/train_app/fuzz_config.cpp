// Fuzz target for the configuration reader (train_app/config_io.cpp, config_limits.h): any input,
// read as YAML and as JSON, must either become a configuration (merged and resolved) or throw a
// UserError (ConfigError, IoError, ...); anything else (a crash, another exception, a sanitizer
// report, unbounded memory) is a bug. Built with NXD_FUZZ_CONFIG_ENTRY it is libFuzzer's entry
// point (NXD_FUZZ, tests/checkpoint/CMakeLists.txt); every build drives it from
// fuzz_config_replay.cpp.
#include <cstddef>
#include <cstdint>
#include <string>

#include "nxd/runtime/error.h"
#include "nxd/train_app/config.h"
#include "nxd/train_app/config_limits.h"

// 1 for each of YAML and JSON that gave a resolved configuration.
extern "C" int nxd_fuzz_config(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  int ok = 0;
  for (bool json : {false, true}) {
    try {
      const nlohmann::json tree = json ? nxd::train_app::parse_json_config(text, "fuzz.json")
                                       : nxd::train_app::parse_yaml(text, "fuzz.yaml");
      nxd::train_app::check_dotted_duplicates(tree, "fuzz");
      if (!tree.is_object()) continue;
      nxd::train_app::Config c;
      c.merge_json(tree, "fuzz");
      (void)nxd::train_app::resolve(c);
      ++ok;
    } catch (const nxd::UserError&) {
    }
  }
  return ok;
}

#ifdef NXD_FUZZ_CONFIG_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)nxd_fuzz_config(data, size);
  return 0;
}
#endif

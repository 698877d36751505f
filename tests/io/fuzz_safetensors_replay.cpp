// Drives the safetensors fuzz target (fuzz_safetensors.cpp) without libFuzzer: deterministic
// mutations of valid plain and zstd files (bit flips, byte changes, truncations, insertions, edits
// of the length prefix) must each read or throw FileError, nothing else.
#include <gtest/gtest.h>

#include <random>

#include "nxd/io/safetensors.h"
#include "support/files.h"
#include "support/mutate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace nxd::io {
namespace {
using nxd::testing::mutate_bytes;

TEST(FuzzSafetensors, MutationsReadOrThrowFileError) {
  const nxd::testing::ScratchDir scratch("nxd_fuzz_");
  const std::vector<std::pair<std::string, Tensor>> ts = {
      {"a", from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3})},
      {"b.weight", from_vector<int64_t>({7, 8}, {2})},
      {"c", zeros({0})},
      {"d", from_vector<double>({9}, {})}};
  write_safetensors(scratch.path / "p.safetensors", ts);
  write_safetensors(scratch.path / "z.safetensors.zst", ts, {}, {.compress = true});
  std::mt19937_64 g(42);
  int inputs = 0;
  for (const char* f : {"p.safetensors", "z.safetensors.zst"}) {
    const std::string good = nxd::testing::slurp(scratch.path / f);
    for (int i = 0; i < 3000; ++i) {
      std::string s = good;
      mutate_bytes(s, g);
      // a crash or an exception other than FileError ends the test here
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
      ++inputs;
    }
  }
  EXPECT_EQ(inputs, 6000);
}

}  // namespace
}  // namespace nxd::io

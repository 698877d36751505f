// Drives the safetensors fuzz target (fuzz_safetensors.cpp) without libFuzzer: deterministic
// mutations of valid plain and zstd files (bit flips, byte changes, truncations, insertions,
// edits of the length prefix) must each read or throw CheckpointError, nothing else.
#include <gtest/gtest.h>

#include <random>

#include "ckpt_util.h"
#include "nxd/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;

TEST(FuzzSafetensors, MutationsReadOrThrowCheckpointError) {
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
      const int edits = 1 + static_cast<int>(g() % 4);
      for (int e = 0; e < edits && !s.empty(); ++e) {
        const size_t at = g() % s.size();
        switch (g() % 6) {
          case 0:
            s[at] = static_cast<char>(s[at] ^ (1 << (g() % 8)));
            break;
          case 1:
            s[at] = static_cast<char>(g());
            break;
          case 2:
            s.resize(at);
            break;
          case 3:
            s.insert(at, 1 + g() % 9, static_cast<char>(g()));
            break;
          case 4:  // the length prefix (plain files)
            s[g() % std::min<size_t>(8, s.size())] = static_cast<char>(g());
            break;
          default:
            s.erase(at, 1 + g() % 16);
        }
      }
      // a crash or an exception other than CheckpointError ends the test here
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
      ++inputs;
    }
  }
  EXPECT_EQ(inputs, 6000);
}

}  // namespace
}  // namespace nxd::ckpt

// Fuzz targets for the files a user hands nxd from outside (issue 34): a transformers folder's
// config.json (read_hf_config) and a tokenizer.json (io::Tokenizer::from_file, then encode and
// decode of a short text), each driven by 2,000 deterministic mutations of its seeds (byte edits,
// and structural edits of the JSON tree that keep it JSON): every input reads or throws a
// UserError (IoError, ConfigError, CheckpointError: what the tools report as exit 2). A crash, a
// hang (ctest's timeout) or any other exception fails the test. Seeds: tests/checkpoint/
// fuzz_seeds_hf (llama, gpt_neox, mixtral) and the tokenizer fixtures (tests/io/fixtures/
// tokenizer: GPT-2, GPT-NeoX, Llama 3). The trace manifest's target is in tests/trace/
// fuzz_graph_replay.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/io/bounded_read.h"
#include "nxd/io/tokenizer.h"
#include "support/files.h"
#include "support/mutate.h"

namespace nxd {
namespace {
namespace fs = std::filesystem;

struct Outcome {
  int read = 0, refused = 0;
};

// 2,000 mutations of the seeds, alternately byte edits and tree edits, each written to `path`
// and given to `target`.
Outcome fuzz(const std::vector<fs::path>& seeds, const fs::path& path,
             const std::function<void()>& target, uint64_t seed) {
  std::mt19937_64 g(seed);
  Outcome o;
  for (int i = 0; i < 2000; ++i) {
    std::string s = nxd::testing::slurp(seeds[static_cast<size_t>(i) % seeds.size()]);
    if (i % 2 == 0) {
      nxd::testing::mutate_bytes(s, g);
    } else {
      nlohmann::json j = nlohmann::json::parse(s);
      for (int k = 1 + static_cast<int>(g() % 3); k > 0; --k) nxd::testing::mutate_json_tree(j, g);
      s = j.dump(1);
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << s;
    try {
      target();
      ++o.read;
    } catch (const UserError&) {
      ++o.refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutation " << i << ": not an nxd user error: " << e.what()
                    << "\ninput: " << io::shorten(s, 2000);
      return o;
    }
  }
  return o;
}

TEST(FuzzInputs, HfConfigJsonReadsOrThrowsAUserError) {
  const nxd::testing::ScratchDir d("nxd_fuzz_hf_");
  const fs::path seeds = fs::path(NXD_SOURCE_DIR) / "tests/checkpoint/fuzz_seeds_hf";
  std::vector<fs::path> files;
  for (const char* f : {"llama.config.json", "gpt_neox.config.json", "mixtral.config.json"}) {
    files.push_back(seeds / f);
    ASSERT_NO_THROW(
        ckpt::model_config_from_hf(nlohmann::json::parse(nxd::testing::slurp(seeds / f))))
        << f;  // each seed reads
  }
  const Outcome o = fuzz(
      files, d.path / "config.json", [&] { (void)ckpt::read_hf_config(d.path); }, 34);
  std::printf("config.json: %d of 2000 mutations read, %d refused\n", o.read, o.refused);
  EXPECT_EQ(o.read + o.refused, 2000);
  EXPECT_GT(o.read, 0);  // the mutations reach past the parser
}

TEST(FuzzInputs, TokenizerJsonReadsOrThrowsAUserError) {
  const nxd::testing::ScratchDir d("nxd_fuzz_tok_");
  const fs::path fx = fs::path(NXD_SOURCE_DIR) / "tests/io/fixtures/tokenizer";
  const std::vector<fs::path> files = {fx / "gpt2.tokenizer.json", fx / "neox.tokenizer.json",
                                       fx / "llama3.tokenizer.json"};
  const fs::path path = d.path / "tokenizer.json";
  const Outcome o = fuzz(
      files, path,
      [&] {
        const io::Tokenizer t = io::Tokenizer::from_file(path.string());
        const std::vector<int64_t> ids = t.encode("Hello, world! 123  \n\tnxd's tokens");
        (void)t.decode(ids);
      },
      35);
  std::printf("tokenizer.json: %d of 2000 mutations read, %d refused\n", o.read, o.refused);
  EXPECT_EQ(o.read + o.refused, 2000);
  EXPECT_GT(o.read, 0);
}

}  // namespace
}  // namespace nxd

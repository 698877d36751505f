// The configuration reader against hostile input (issue 25, cases 6 and 7): each input that
// crashed it, exhausted memory, hung or was silently accepted on main is now a one-line
// ConfigError or IoError naming the file or key, with long values shortened.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "nxd/io/env_check.h"
#include "nxd/runtime/error.h"
#include "nxd/train_app/config.h"
#include "nxd/train_app/config_limits.h"
#include "nxd/train_app/corpus.h"
#include "support/files.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
namespace fs = std::filesystem;

namespace {

fs::path write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

// The message of the UserError f throws ("no error" if none; another exception fails the test).
template <class F>
std::string user_error(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

#define EXPECT_HAS(msg, part) \
  EXPECT_NE((msg).find(part), std::string::npos) << "message: " << (msg) << "\nexpected: " << (part)

std::string merge(const fs::path& p) {
  return user_error([&] { Config().merge_file(p.string()); });
}

TEST(ConfigLimits, DeepNestingIsRefusedBeforeParsing) {
  const fs::path d = nxd::testing::test_temp_dir("nxd_cfg_limits_");
  // 100,000-deep JSON list: SIGSEGV on main (formatting the error recursed)
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  std::string m = merge(write(d / "deep.json", deep));
  EXPECT_HAS(m, "nested deeper than 64 levels");
  m = merge(write(d / "deep.yaml", "model: " + deep + "\n"));
  EXPECT_HAS(m, "nested deeper than 64 levels");
  // block-style nesting too (not brackets): yaml_to_json's depth
  std::string block;
  for (int i = 0; i < 70; ++i) block += std::string(static_cast<size_t>(i), ' ') + "k:\n";
  m = merge(write(d / "block.yaml", block));
  EXPECT_HAS(m, "nested deeper than 64 levels");
  EXPECT_LT(m.size(), 300u) << m;
}

TEST(ConfigLimits, AYamlAliasBombIsRefused) {
  const fs::path d = nxd::testing::test_temp_dir("nxd_cfg_limits_");
  // 9 levels of 9 aliases: 9^9 values; memory grew ~650 MB/s on main
  std::string y = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 9; ++i) {
    y += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int j = 0; j < 9; ++j) y += std::string(j ? ", " : "") + "*a" + std::to_string(i - 1);
    y += "]\n";
  }
  ASSERT_LT(y.size(), 700u);
  const std::string m = merge(write(d / "bomb.yaml", y));
  EXPECT_HAS(m, "more than 100000 values (counted after YAML aliases expand)");
}

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// Issue 34, case 9: a 16 MB flow list (under the 16 MiB file limit) cost 3.8 GiB and 27 s in
// yaml-cpp before the value budget refused it; its items are now counted before parsing.
TEST(ConfigLimits, AHugeListIsRefusedBeforeParsing) {
  const fs::path d = nxd::testing::test_temp_dir("nxd_cfg_limits_");
  std::string flow = "model: {hidden_size: 32}\nx: [";
  flow.reserve(16 << 20);
  while (flow.size() < (15 << 20)) flow += "1,";
  flow += "1]\n";
  const long before = peak_rss_kib();
  std::string m = merge(write(d / "flow.yaml", flow));
  EXPECT_HAS(m, "flow.yaml:2: more than 100000 list items, keys or lines (counted before parsing)");
  m = merge(write(d / "flow.json", "{\"x\": [" + flow.substr(flow.find('[') + 1, 1 << 20) + "1]}"));
  EXPECT_HAS(m, "flow.json:1: more than 100000 list items");
  std::string block = "x:\n";
  while (block.size() < (4 << 20)) block += "  - 1\n";
  m = merge(write(d / "block.yaml", block));
  EXPECT_HAS(m, "block.yaml:100001: more than 100000 list items");
  // the peak stays near the files' text (read once, 15 MiB): parsing them held gigabytes
  EXPECT_LT(peak_rss_kib() - before, 256 << 10) << "KiB";
  // a configuration of ordinary size still reads (commas inside strings are not items)
  EXPECT_EQ(merge(write(d / "ok.yaml", "data: {path: \"a,b,c\"}\nmodel: {hidden_size: 32}\n")),
            "no error");
}

TEST(ConfigLimits, OnlyRegularFilesAreRead) {
  const fs::path d = nxd::testing::test_temp_dir("nxd_cfg_limits_");
  EXPECT_HAS(merge("/dev/zero"), "config file '/dev/zero' is a character device");
  EXPECT_HAS(merge(d), "is a directory");  // was accepted as an empty config
  ASSERT_EQ(mkfifo((d / "fifo").c_str(), 0600), 0);
  EXPECT_HAS(merge(d / "fifo"), "is a FIFO");  // returns at once: the FIFO is never opened
  EXPECT_HAS(user_error([] { load_text_corpus("/dev/zero"); }),
             "data.path '/dev/zero' is a character device");
  EXPECT_HAS(user_error([&] { load_text_corpus((d / "fifo").string()); }), "is a FIFO");
  EXPECT_HAS(user_error([&] { load_token_file((d / "fifo").string(), 2, 256); }), "is a FIFO");
  // too large: a config file is at most 16 MiB
  write(d / "big.yaml", "# " + std::string(17 << 20, 'x') + "\n");
  EXPECT_HAS(merge(d / "big.yaml"), "is larger than 16777216 bytes");
}

TEST(ConfigLimits, DuplicateKeysAndSectionsAreRefused) {
  const fs::path d = nxd::testing::test_temp_dir("nxd_cfg_limits_");
  EXPECT_HAS(merge(write(d / "k.yaml", "seed: 1\nseed: 2\n")), "k.yaml:2: duplicate key 'seed'");
  EXPECT_HAS(merge(write(d / "s.yaml", "model: {hidden_size: 32}\ntrainer: {}\nmodel: {}\n")),
             "duplicate key 'model'");
  EXPECT_HAS(merge(write(d / "n.yaml", "model:\n  hidden_size: 32\n  hidden_size: 64\n")),
             "duplicate key 'hidden_size'");
  EXPECT_HAS(merge(write(d / "dot.yaml", "model.hidden_size: 32\nmodel: {hidden_size: 64}\n")),
             "'model.hidden_size' is given twice");
  EXPECT_HAS(merge(write(d / "k.json", R"({"seed": 1, "model": {"hidden_size": 8}, "seed": 2})")),
             "duplicate key 'seed'");
  // distinct keys in distinct mappings are fine
  EXPECT_EQ(merge(write(d / "ok.json", R"({"model": {"hidden_size": 8}, "data": {"path": "x"}})")),
            "no error");
}

TEST(ConfigLimits, MessagesShortenLongValues) {
  std::string big = "[";
  for (int i = 0; i < 50000; ++i) big += (i ? ", " : "") + std::to_string(i);
  big += "]";  // ~340 kB: the message echoed all of it on main
  std::string m = user_error([&] { Config().apply_override("model.hidden_size=" + big); });
  EXPECT_HAS(m, "model.hidden_size: expected an integer, got list [0,1,2");
  EXPECT_LT(m.size(), 400u) << m.substr(0, 400);
  m = user_error([&] { Config().apply_override(std::string(100000, 'k') + "=1"); });
  EXPECT_HAS(m, "unknown key 'kkk");
  EXPECT_LT(m.size(), 600u);
}

TEST(ConfigLimits, ThreadCountsSizesAndEnvironmentAreChecked) {
  auto resolved = [](std::vector<std::string> sets) {
    return user_error([&] {
      Config c;
      for (const auto& s : sets) c.apply_override(s);
      (void)resolve(c);
    });
  };
  // "internal error" exit 1 on main
  EXPECT_HAS(resolved({"trainer.num_threads=1000000"}),
             "trainer.num_threads=1000000 is more than 1024 threads");
  // "must be positive, got 0" for a derived size on main (overflow)
  EXPECT_HAS(resolved({"model.hidden_size=4611686018427387904"}),
             "model.hidden_size=4611686018427387904 is too large (at most 2147483647)");
  // silently ignored on main
  for (const auto& [var, value, want] :
       std::vector<std::tuple<const char*, const char*, const char*>>{
           {"NXD_NUM_THREADS", "lots", "NXD_NUM_THREADS='lots': expected a thread count"},
           {"NXD_NUM_THREADS", "0", "NXD_NUM_THREADS='0'"},
           {"NXD_GEMM", "mkl", "NXD_GEMM='mkl': expected openblas or eigen"},
           {"NXD_SIM_TIMEOUT", "soon", "NXD_SIM_TIMEOUT='soon': expected seconds > 0"},
           {"NXD_MPI_TIMEOUT", "-1", "NXD_MPI_TIMEOUT='-1': expected seconds >= 0"},
           {"NXD_HOST_CACHE_MB", "-5", "NXD_HOST_CACHE_MB='-5'"}}) {
    const char* old = std::getenv(var);
    const std::string keep = old ? old : "";
    setenv(var, value, 1);
    EXPECT_HAS(user_error([] { io::check_environment(); }), want);
    if (std::string(var) == "NXD_NUM_THREADS")
      EXPECT_HAS(resolved({"trainer.num_threads=0"}), want);
    if (old)
      setenv(var, keep.c_str(), 1);
    else
      unsetenv(var);
  }
}

}  // namespace

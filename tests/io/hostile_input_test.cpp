// Files from outside, written as a hostile but realistic user would (issue 34's findings): each
// is refused with a user error naming the file and value (tools exit 2), never a crash, a hang, an
// allocation failure or minutes of work.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/io_util.h"
#include "nxd/io/bounded_read.h"
#include "nxd/io/hf_folder.h"
#include "nxd/io/safetensors.h"
#include "nxd/io/tokenizer.h"
#include "nxd/runtime/error.h"

namespace nxd::io {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using nxd::testing::error_of;
using nxd::testing::ScratchDir;

// What f throws: the message of a UserError (what tools turn into exit 2), or a description of
// anything else.
std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a user error: ") + e.what();
  }
  return "no exception";
}

void write(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

// A byte-level BPE tokenizer.json with the given vocabulary and pre-tokenizer.
json tokenizer_json(const json& vocab, const json& pre) {
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
          {"pre_tokenizer", pre}};
}
const json kByteLevel = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};

// `depth` nested lists as a JSON value.
std::string deep(int depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

TEST(HostileTokenizer, OutOfRangeIdsAreRefusedByName) {
  const ScratchDir d("nxd_hostile_");
  for (const std::string id : {"-5", "4611686018427387904", "1000000000", "2.5", "\"7\""}) {
    SCOPED_TRACE(id);
    write(d.path / "t.json", str(R"({"model": {"type": "BPE", "vocab": {"a": 0, "zzz": )", id,
                                 R"(}, "merges": []}, "pre_tokenizer": )", kByteLevel.dump(), "}"));
    const std::string m =
        user_error_of([&] { Tokenizer::from_file((d.path / "t.json").string()); });
    EXPECT_NE(m.find("piece 'zzz' has id"), std::string::npos) << m;
  }
}

TEST(HostileTokenizer, DeepJsonIsRefusedBeforeParsing) {
  const ScratchDir d("nxd_hostile_");
  write(d.path / "t.json",
        str(R"({"normalizer": )", deep(100000), R"(, "model": {"type": "BPE"}})"));
  const std::string m = user_error_of([&] { Tokenizer::from_file((d.path / "t.json").string()); });
  EXPECT_NE(m.find("nested deeper than 64 levels"), std::string::npos) << m;
}

TEST(HostileTokenizer, FifosAndDevicesAreRefusedWithoutBlocking) {
  const ScratchDir d("nxd_hostile_");
  const fs::path fifo = d.path / "fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string m = user_error_of([&] { Tokenizer::from_file(fifo.string()); });
  EXPECT_NE(m.find("is a FIFO, not a regular file"), std::string::npos) << m;
  m = user_error_of([&] { Tokenizer::from_file("/dev/zero"); });
  EXPECT_NE(m.find("is a character device"), std::string::npos) << m;
  m = user_error_of([&] { SafetensorsReader r(fifo); });
  EXPECT_NE(m.find("is a FIFO"), std::string::npos) << m;
  m = user_error_of([&] { read_file(fifo); });
  EXPECT_NE(m.find("is a FIFO"), std::string::npos) << m;
}

// tokenizers' Split with a regex that backtracks exponentially: (a|aa)+$ on a run of a's that
// does not end the text tries every way to split the run (2^40 here) before giving up.
TEST(HostileTokenizer, ExponentialRegexStopsAtItsLimit) {
  const ScratchDir d("nxd_hostile_");
  const json split = {{"type", "Split"},
                      {"pattern", {{"Regex", "(a|aa)+$|x"}}},
                      {"behavior", "Isolated"},
                      {"invert", false}};
  const json pre = {{"type", "Sequence"},
                    {"pretokenizers", {split, {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  write(d.path / "t.json", tokenizer_json({{"a", 0}, {"b", 1}, {"x", 2}}, pre).dump());
  const Tokenizer t = Tokenizer::from_file((d.path / "t.json").string());
  EXPECT_EQ(t.encode("aab").size(), 3u) << "a short text still encodes";
  const auto t0 = std::chrono::steady_clock::now();
  const std::string m = user_error_of([&] { t.encode(std::string(40, 'a') + "b"); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(m.find("exceeded its time limit"), std::string::npos) << m;
  EXPECT_LT(s, 20.0) << "the limit stops the match long before the 2^40 splits";
  std::printf("exponential regex refused after %.2f s\n", s);
  // the limit is per match: long ordinary text and long runs of spaces (GPT-2's \s+(?!\S)) pass
  const Tokenizer gpt2 =
      Tokenizer::from_file(std::string(NXD_TOKENIZER_FIXTURES) + "/gpt2.tokenizer.json");
  std::string text;
  while (text.size() < (1u << 20)) text += "The quick brown fox, 12 jumps; over the lazy dog.\n";
  EXPECT_GT(gpt2.encode(text + std::string(200000, ' ') + "x").size(), 200000u);
}

// A transformers folder: config.json and model.safetensors with a raw header.
fs::path hf_folder(const fs::path& dir, const std::string& header, const std::string& data) {
  write(dir / "config.json", R"({"model_type": "llama"})");
  std::string file(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  write(dir / "model.safetensors", file + header + data);
  return dir;
}

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

TEST(HostileHfFolder, HostileSafetensorsHeadersAreFileErrors) {
  const ScratchDir d("nxd_hostile_");
  const std::string ok = f32_bytes({1, 2});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1, 2, 3]", "not a JSON object"},
      {R"({"w": {"dtype": 5, "shape": [2], "data_offsets": [0, 8]}})", "malformed entry"},
      {R"({"w": {"dtype": "F32", "shape": "x", "data_offsets": [0, 8]}})", "malformed entry"},
      {R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", "larger than the file"},
      {R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 8]}})",
       "larger than the file"},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "v": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
       "overlap"},
      {str(R"({"w": )", deep(100000), "}"), "nested deeper"}};
  for (const auto& [header, want] : cases) {
    SCOPED_TRACE(header.substr(0, 80));
    hf_folder(d.path, header, ok);
    const std::string m = error_of([&] { read_hf_tensors(d.path); });
    EXPECT_NE(m.find(want), std::string::npos) << m;
  }
  // a header length of 2^63
  hf_folder(d.path, "{}", ok);
  std::string bytes = nxd::testing::slurp(d.path / "model.safetensors");
  bytes[7] = static_cast<char>(0x80);
  write(d.path / "model.safetensors", bytes);
  const std::string m = error_of([&] { read_hf_tensors(d.path); });
  EXPECT_NE(m.find("is not a safetensors file"), std::string::npos) << m;
}

TEST(HostileHfFolder, NonFiniteWeightsAreRefusedByName) {
  const ScratchDir d("nxd_hostile_");
  hf_folder(d.path, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
            f32_bytes({1, std::numeric_limits<float>::quiet_NaN()}));
  const std::string m = error_of([&] { read_hf_tensors(d.path); });
  EXPECT_NE(m.find("tensor 'w' holds nan at element 1"), std::string::npos) << m;
}

TEST(HostileHfFolder, ConfigJsonIsBoundedAndRegular) {
  const ScratchDir d("nxd_hostile_");
  hf_folder(d.path, "{}", "");
  write(d.path / "config.json",
        str(R"({"model_type": "llama", "rope_scaling": {"type": "x", "a": )", deep(100000), "}}"));
  std::string m = user_error_of([&] { read_hf_config_json(d.path); });
  EXPECT_NE(m.find("nested deeper than 64 levels"), std::string::npos) << m;
  fs::remove(d.path / "config.json");
  ASSERT_EQ(::mkfifo((d.path / "config.json").c_str(), 0600), 0);
  m = user_error_of([&] { read_hf_config_json(d.path); });
  EXPECT_NE(m.find("is a FIFO"), std::string::npos) << m;
}

TEST(BoundedRead, IntegersAreRangeCheckedAndValuesShortened) {
  const json j = {
      {"n", 0}, {"f", 64.5}, {"big", 18446744073709551615ull}, {"s", std::string(200000, 'x')}};
  EXPECT_NE(user_error_of([&] {
              json_int(j, "n", 1, 8, "c.json", "t");
            }).find("'n' = 0 is outside [1, 8]"),
            std::string::npos);
  EXPECT_NE(
      user_error_of([&] { json_int(j, "f", 1, 8, "c.json", "t"); }).find("64.5, not an integer"),
      std::string::npos);
  EXPECT_NE(user_error_of([&] { json_int(j, "big", 1, 8, "c.json", "t"); }).find("outside"),
            std::string::npos);
  const std::string m = user_error_of([&] { json_int(j, "s", 1, 8, "c.json", "t"); });
  EXPECT_LT(m.size(), 300u) << "a 200,000-character value is shortened in the message";
  EXPECT_NE(m.find("(200002 characters)"), std::string::npos) << m;
}

}  // namespace
}  // namespace nxd::io

// safetensors files: the bytes on disk follow the format (checked here with a separate parse of
// the raw bytes, not with nxd's reader), round trips are bitwise for every dtype, compressed files
// are one zstd frame of the plain file, and every damaged file is refused with an error naming
// the file and the tensor.
#include <gtest/gtest.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/io_util.h"
#include "nxd/io/crc32c.h"
#include "nxd/io/safetensors.h"
#include "support/compare.h"
#include "support/files.h"
#include "support/random.h"

namespace nxd::io {
namespace {
namespace fs = std::filesystem;
using nxd::testing::error_of;
using nxd::testing::slurp;

void spit(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}

std::vector<std::pair<std::string, Tensor>> sample_tensors() {
  using nxd::testing::randn;
  return {
      {"model.embed_tokens.weight", randn({7, 5}, 1, DType::f32)},
      {"layers.0.mlp.weight", randn({3, 4, 2}, 2, DType::bf16)},
      {"norm.bias", randn({6}, 3, DType::f64)},
      {"ids", from_vector<int32_t>({1, -2, 3, 2147483647}, {2, 2})},
      {"step", from_vector<int64_t>({int64_t{1} << 40}, {})},  // a scalar: shape []
      {"empty", zeros({0, 3})},
  };
}

TEST(Crc32c, KnownValuesAndHardwareMatchesTable) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  std::mt19937_64 g(7);
  std::vector<unsigned char> buf(100003);
  for (auto& b : buf) b = static_cast<unsigned char>(g());
  for (size_t n : {0ul, 1ul, 7ul, 8ul, 24575ul, 24576ul, 24577ul, 73733ul, 100003ul}) {
    EXPECT_EQ(crc32c(buf.data(), n), crc32c_portable(buf.data(), n)) << "n=" << n;
    const size_t h = n / 3;  // incremental = whole
    EXPECT_EQ(crc32c(buf.data() + h, n - h, crc32c(buf.data(), h)), crc32c(buf.data(), n));
  }
  uint32_t v = 0;
  EXPECT_TRUE(parse_crc_hex(crc_hex(0x0badf00du), &v));
  EXPECT_EQ(v, 0x0badf00du);
  EXPECT_FALSE(parse_crc_hex("12345g78", &v));
}

// The file is checked byte by byte against the format, independently of SafetensorsReader.
TEST(Safetensors, FileFollowsTheFormat) {
  const nxd::testing::ScratchDir dir_scratch("nxd_st_");
  const fs::path& dir = dir_scratch.path;
  const auto ts = sample_tensors();
  const WriteStats st = write_safetensors(dir / "a.safetensors", ts, {{"user", "x"}});
  const std::string bytes = slurp(dir / "a.safetensors");
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u) << "header length " << n;
  ASSERT_LE(8 + n, bytes.size());
  const std::string head = bytes.substr(8, n);
  EXPECT_EQ(head.front(), '{');
  const size_t close = head.find_last_not_of(' ');
  EXPECT_EQ(head[close], '}');
  const auto j = nlohmann::json::parse(head);
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(j["__metadata__"]["user"], "x");
  const std::map<DType, std::string> names = {{DType::f32, "F32"},
                                              {DType::bf16, "BF16"},
                                              {DType::f64, "F64"},
                                              {DType::i32, "I32"},
                                              {DType::i64, "I64"}};
  int64_t end = 0;
  for (const auto& [name, t] : ts) {
    ASSERT_TRUE(j.contains(name)) << name;
    const auto& e = j[name];
    EXPECT_EQ(e["dtype"], names.at(t.dtype())) << name;
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), t.shape()) << name;
    const int64_t b = e["data_offsets"][0], f = e["data_offsets"][1];
    EXPECT_EQ(f - b, t.nbytes()) << name;
    end = std::max(end, f);
    if (t.nbytes() > 0) {
      EXPECT_EQ(0, std::memcmp(bytes.data() + 8 + n + b, t.raw_data(), t.nbytes())) << name;
    }
    // the checksum of each tensor is in the metadata
    EXPECT_EQ(j["__metadata__"]["nxd.crc32c." + name],
              crc_hex(crc32c(t.numel() ? t.raw_data() : nullptr, t.nbytes())))
        << name;
  }
  EXPECT_EQ(bytes.size(), 8 + n + end);
  EXPECT_EQ(st.file_bytes, static_cast<int64_t>(bytes.size()));
  // nothing but the file is left in the folder (the temporary was renamed)
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

TEST(Safetensors, RoundTripIsBitwisePlainAndCompressed) {
  const nxd::testing::ScratchDir dir_scratch("nxd_st_");
  const fs::path& dir = dir_scratch.path;
  const auto ts = sample_tensors();
  write_safetensors(dir / "plain.safetensors", ts, {{"k", "v"}});
  write_safetensors(dir / "z.safetensors.zst", ts, {{"k", "v"}}, {.compress = true});
  for (const char* f : {"plain.safetensors", "z.safetensors.zst"}) {
    SafetensorsReader r(dir / f);
    EXPECT_EQ(r.compressed(), std::string(f) != "plain.safetensors");
    EXPECT_EQ(r.header().metadata.at("k"), "v");
    auto got = r.read_all();
    ASSERT_EQ(got.size(), ts.size());
    for (size_t i = 0; i < ts.size(); ++i) {
      EXPECT_EQ(got[i].first, ts[i].first);
      EXPECT_BITWISE_EQ(got[i].second, ts[i].second);
    }
  }
  // the compressed file is one zstd frame whose content is exactly the plain file
  const std::string z = slurp(dir / "z.safetensors.zst"), plain = slurp(dir / "plain.safetensors");
  std::string back(plain.size(), '\0');
  const size_t rc = ZSTD_decompress(back.data(), back.size(), z.data(), z.size());
  ASSERT_FALSE(ZSTD_isError(rc)) << ZSTD_getErrorName(rc);
  EXPECT_EQ(rc, plain.size());
  EXPECT_TRUE(back == plain);
}

TEST(Safetensors, StridedTensorsAreWrittenInRowMajorOrder) {
  const nxd::testing::ScratchDir dir_scratch("nxd_st_");
  const fs::path& dir = dir_scratch.path;
  Tensor a = nxd::testing::randn({4, 6}, 5, DType::f32);
  Tensor t = a.t();  // [6,4] view, not contiguous
  write_safetensors(dir / "t.safetensors", {{"t", t}});
  SafetensorsReader r(dir / "t.safetensors");
  auto got = r.read_all();
  EXPECT_BITWISE_EQ(got[0].second, t.contiguous());
}

TEST(Safetensors, DamagedFilesNameTheFileAndTensor) {
  const nxd::testing::ScratchDir dir_scratch("nxd_st_");
  const fs::path& dir = dir_scratch.path;
  const auto ts = sample_tensors();
  const fs::path p = dir / "a.safetensors";
  write_safetensors(p, ts);
  const std::string good = slurp(p);
  SafetensorsHeader h = SafetensorsReader(p).header();
  const TensorInfo* norm = h.find("norm.bias");
  ASSERT_NE(norm, nullptr);

  // a flipped bit in the data of one tensor
  std::string bad = good;
  bad[h.data_start + norm->begin + 3] ^= 0x10;
  spit(p, bad);
  std::string m = error_of([&] { SafetensorsReader(p).read_all(); });
  EXPECT_NE(m.find("checksum mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find("'norm.bias'"), std::string::npos) << m;
  EXPECT_NE(m.find(p.string()), std::string::npos) << m;

  // truncated inside a tensor
  spit(p, good.substr(0, h.data_start + norm->begin + 5));
  m = error_of([&] { SafetensorsReader(p).read_all(); });
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  EXPECT_NE(m.find("'norm.bias'"), std::string::npos) << m;

  // truncated inside the header, and shorter than the length prefix
  spit(p, good.substr(0, 20));
  EXPECT_NE(error_of([&] { SafetensorsReader r(p); }).find("truncated inside"), std::string::npos);
  spit(p, good.substr(0, 5));
  EXPECT_NE(error_of([&] { SafetensorsReader r(p); }).find("truncated"), std::string::npos);

  // trailing garbage
  spit(p, good + "xx");
  EXPECT_NE(error_of([&] { SafetensorsReader r(p); }).find("after the last tensor"),
            std::string::npos);

  // a missing file
  EXPECT_NE(error_of([&] { SafetensorsReader r(dir / "nope.safetensors"); }).find("cannot open"),
            std::string::npos);

  // compressed: a flipped byte in the middle and a truncated frame
  const fs::path z = dir / "z.safetensors.zst";
  write_safetensors(z, ts, {}, {.compress = true});
  const std::string zg = slurp(z);
  std::string zb = zg;
  zb[zb.size() / 2] ^= 0x01;
  spit(z, zb);
  m = error_of([&] { SafetensorsReader(z).read_all(); });
  EXPECT_NE(m.find(z.string()), std::string::npos) << m;
  EXPECT_EQ(m.find("no exception"), std::string::npos) << m;
  spit(z, zg + "garbage");
  m = error_of([&] { SafetensorsReader(z).read_all(); });
  EXPECT_NE(m.find("data after the zstd frame"), std::string::npos) << m;
  spit(z, zg.substr(0, zg.size() - 9));
  m = error_of([&] { SafetensorsReader(z).read_all(); });
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
}

TEST(Safetensors, MalformedHeadersAreRefused) {
  auto check = [](const std::string& json, const std::string& expect) {
    const std::string m = error_of([&] { parse_header(json, "f.safetensors"); });
    EXPECT_NE(m.find(expect), std::string::npos) << json << " -> " << m;
    EXPECT_NE(m.find("f.safetensors"), std::string::npos) << m;
  };
  check(R"({"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})", "unsupported dtype");
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "needs 8");
  check(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "starts at byte 4");
  check(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
        "'b' starts at byte 2");
  check(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "bad shape");
  check(R"({"a":{"dtype":"F32","shape":[1]}})", "needs dtype, shape and data_offsets");
  check(R"({"__metadata__":{"x":1}})", "not a string");
  check(R"({"__metadata__":{"nxd.crc32c.a":"zz"}})", "malformed");
  check(R"({"__metadata__":{"nxd.crc32c.q":"00000000"}})", "not in the file: 'q'");
  check(R"([1,2])", "not a JSON object");
  check(R"({"a":)", "not valid JSON");
  const auto h = parse_header(R"({"b":{"dtype":"I64","shape":[],"data_offsets":[4,12]},)"
                              R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                              "f");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");  // file order
  EXPECT_EQ(h.data_size, 12);
}

TEST(Safetensors, WriterRejectsBadInputAndLeavesNoFile) {
  const nxd::testing::ScratchDir dir_scratch("nxd_st_");
  const fs::path& dir = dir_scratch.path;
  Tensor a = zeros({2});
  EXPECT_THROW(write_safetensors(dir / "d.safetensors", {{"a", a}, {"a", a}}), InvalidArgument);
  EXPECT_THROW(
      write_safetensors(dir / "m.safetensors", {{"a", zeros({2}, DType::f32, Device::meta)}}),
      InvalidArgument);
  EXPECT_THROW(write_safetensors(dir / "e.safetensors", {{"__metadata__", a}}), InvalidArgument);
  {
    AtomicFile f(dir / "x");
    f.write("abc", 3);
  }  // not committed
  EXPECT_TRUE(fs::is_empty(dir));
}

}  // namespace
}  // namespace nxd::io

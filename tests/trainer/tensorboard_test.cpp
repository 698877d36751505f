// TensorBoard event files, read back with a reader written from the format: TFRecord framing
// (every CRC checked) and the Event / Summary protobuf fields; the logged values equal the
// metrics.csv rows of the same run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "nxd/train_app/train.h"
#include "nxd/trainer/loggers.h"
#include "support/files.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
namespace fs = std::filesystem;

namespace {

// ---- a minimal protobuf reader ----
struct Field {
  int number = 0;
  int wire = 0;
  uint64_t varint = 0;  // wire 0
  uint64_t fixed = 0;   // wire 1 (8 bytes) and 5 (4 bytes)
  std::string bytes;    // wire 2
};

uint64_t read_varint(const std::string& s, size_t& p) {
  uint64_t v = 0;
  for (int shift = 0; p < s.size(); shift += 7) {
    const auto b = static_cast<unsigned char>(s[p++]);
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
  throw std::runtime_error("truncated varint");
}

std::vector<Field> parse_message(const std::string& s) {
  std::vector<Field> out;
  size_t p = 0;
  while (p < s.size()) {
    Field f;
    const uint64_t key = read_varint(s, p);
    f.number = static_cast<int>(key >> 3);
    f.wire = static_cast<int>(key & 7);
    if (f.wire == 0) {
      f.varint = read_varint(s, p);
    } else if (f.wire == 1 || f.wire == 5) {
      const size_t n = f.wire == 1 ? 8 : 4;
      if (p + n > s.size()) throw std::runtime_error("truncated fixed field");
      std::memcpy(&f.fixed, s.data() + p, n);
      p += n;
    } else if (f.wire == 2) {
      const uint64_t n = read_varint(s, p);
      if (p + n > s.size()) throw std::runtime_error("truncated bytes field");
      f.bytes = s.substr(p, n);
      p += n;
    } else {
      throw std::runtime_error("unexpected wire type " + std::to_string(f.wire));
    }
    out.push_back(f);
  }
  return out;
}

// Every record of a TFRecord file; fails the test on a bad CRC or a truncated record.
std::vector<std::string> read_records(const fs::path& path) {
  const std::string s = nxd::testing::slurp(path);
  std::vector<std::string> out;
  size_t p = 0;
  auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, s.data() + at, 4);
    return v;
  };
  while (p < s.size()) {
    EXPECT_LE(p + 12, s.size()) << "truncated header at " << p;
    if (p + 12 > s.size()) break;
    uint64_t len;
    std::memcpy(&len, s.data() + p, 8);
    EXPECT_EQ(u32(p + 8), tfrecord::masked_crc32c(s.data() + p, 8)) << "length crc at " << p;
    EXPECT_LE(p + 12 + len + 4, s.size()) << "truncated record at " << p;
    if (p + 12 + len + 4 > s.size()) break;
    const std::string data = s.substr(p + 12, len);
    EXPECT_EQ(u32(p + 12 + len), tfrecord::masked_crc32c(data.data(), data.size()))
        << "data crc at " << p;
    out.push_back(data);
    p += 12 + len + 4;
  }
  return out;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::map<std::string, float> scalars;
  std::map<std::string, std::string> texts;
};

Event decode_event(const std::string& rec) {
  Event e;
  for (const Field& f : parse_message(rec)) {
    if (f.number == 1 && f.wire == 1) std::memcpy(&e.wall_time, &f.fixed, 8);
    if (f.number == 2 && f.wire == 0) e.step = static_cast<int64_t>(f.varint);
    if (f.number == 3 && f.wire == 2) e.file_version = f.bytes;
    if (f.number == 5 && f.wire == 2) {
      for (const Field& v : parse_message(f.bytes)) {  // Summary.value
        std::string tag, text;
        std::optional<float> simple;
        for (const Field& x : parse_message(v.bytes)) {
          if (x.number == 1) tag = x.bytes;
          if (x.number == 2 && x.wire == 5) {
            float fv;
            std::memcpy(&fv, &x.fixed, 4);
            simple = fv;
          }
          if (x.number == 8)  // TensorProto: string_val = 8
            for (const Field& t : parse_message(x.bytes))
              if (t.number == 8) text = t.bytes;
        }
        if (simple)
          e.scalars[tag] = *simple;
        else
          e.texts[tag] = text;
      }
    }
  }
  return e;
}

}  // namespace

TEST(TensorBoard, Crc32cKnownValues) {
  // RFC 3720 B.4 test vectors for CRC32C
  EXPECT_EQ(tfrecord::crc32c("123456789", 9), 0xE3069283u);
  std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(tfrecord::crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(tfrecord::crc32c(ones.data(), ones.size()), 0x62A8AB43u);
}

TEST(TensorBoard, EventsDecodeAndEqualMetricsCsv) {
  auto d = nxd::testing::test_temp_dir("nxd_tensorboard_");
  Config c;
  for (std::string s :
       {"backend.world_size=2", "distributed_strategy.tensor_model_parallel_size=1",
        "trainer.max_steps=6", "trainer.log_every_n_steps=2", "trainer.val_check_interval=3",
        "trainer.limit_val_batches=2", "data.kind=random", "data.random_num_samples=128",
        "data.seq_length=16", "data.global_batch_size=4", "model.vocab_size=64",
        "model.num_layers=1", "model.hidden_size=16", "model.num_attention_heads=2",
        "generation.max_new_tokens=0"})
    c.apply_override(s);
  c.apply_override("exp_manager.exp_dir=" + d.string());
  train(resolve(c), {.quiet = true});

  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(d / "tensorboard")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].filename().string().rfind("events.out.tfevents.", 0), 0u);
  const auto records = read_records(files[0]);
  ASSERT_GE(records.size(), 3u);
  EXPECT_EQ(decode_event(records[0]).file_version, "brain.Event:2");
  const Event cfg = decode_event(records[1]);
  ASSERT_EQ(cfg.texts.count("config"), 1u);
  EXPECT_NE(cfg.texts.at("config").find("max_steps: 6"), std::string::npos);

  const auto csv = nxd::testing::read_csv(d / "metrics.csv");
  ASSERT_EQ(csv.rows.size() + 2, records.size());  // file_version, config, then one per row
  for (size_t i = 0; i < csv.rows.size(); ++i) {
    const auto& row = csv.rows[i];
    const Event e = decode_event(records[i + 2]);
    EXPECT_EQ(e.step, std::stoll(row[0]));
    EXPECT_GT(e.wall_time, 1.6e9);
    // the CSV has 9 significant digits of the double, TensorBoard its float: equal to within
    // the float's rounding
    auto same = [&](const std::string& tag, const std::string& csv_value) {
      const double want = std::stod(csv_value);
      EXPECT_NEAR(e.scalars.at(tag), want, std::abs(want) * 1.2e-7) << tag << ", row " << i;
    };
    same("loss", row[1]);
    if (!row[2].empty())
      same("val_loss", row[2]);
    else
      EXPECT_EQ(e.scalars.count("val_loss"), 0u);
    same("lr", row[3]);
    same("grad_norm", row[4]);
    EXPECT_EQ(e.scalars.count("sim_step_ms"), 1u);  // 2 sim ranks: a modeled clock
    EXPECT_GT(e.scalars.at("hbm_peak_mib"), 0.0f);
    EXPECT_EQ(e.scalars.count("lr-decay"), 1u);
  }
}

TEST(TensorBoard, OffByConfig) {
  auto d = nxd::testing::test_temp_dir("nxd_tensorboard_");
  Config c;
  for (std::string s :
       {"backend.world_size=1", "distributed_strategy.tensor_model_parallel_size=1",
        "trainer.max_steps=1", "data.kind=random", "data.random_num_samples=64",
        "data.seq_length=8", "data.global_batch_size=2", "model.vocab_size=32",
        "model.num_layers=1", "model.hidden_size=8", "model.num_attention_heads=1",
        "generation.max_new_tokens=0", "exp_manager.create_tensorboard_logger=false"})
    c.apply_override(s);
  c.apply_override("exp_manager.exp_dir=" + d.string());
  train(resolve(c), {.quiet = true});
  EXPECT_TRUE(fs::exists(d / "metrics.csv"));
  EXPECT_FALSE(fs::exists(d / "tensorboard"));
}

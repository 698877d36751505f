#include "nxd/trainer/loggers.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <vector>

#include "nxd/runtime/error.h"

namespace fs = std::filesystem;

namespace nxd::trainer {

namespace {

void create_dir(const std::string& dir, const char* who) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(str("[", who, "] cannot create directory '", dir, "': ", ec.message()));
}

double wall_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

// ---- CSV ----

CSVLogger::CSVLogger(const std::string& dir)
    : path_((create_dir(dir, "csv_logger"), (fs::path(dir) / "metrics.csv").string())),
      writer_(path_) {}

CSVLogger::~CSVLogger() {
  for (std::FILE* f : side_)
    if (f) std::fclose(f);
}

namespace {
// The side files of the extras a module logs: written once a row carries the first column.
struct SideFile {
  const char* name;
  std::vector<const char*> columns;
};
const std::vector<SideFile>& side_files() {
  static const std::vector<SideFile> files{
      {"moe_metrics.csv",
       {"moe_aux_loss", "moe_tokens_dropped", "moe_expert_load_min", "moe_expert_load_max"}},
      {"sft_metrics.csv", {"sft_trained_tokens", "sft_masked_tokens"}},
      {"dpo_metrics.csv",
       {"dpo_rewards_chosen", "dpo_rewards_rejected", "dpo_rewards_margin",
        "dpo_rewards_accuracy"}},
      {"orpo_metrics.csv",
       {"orpo_rewards_chosen", "orpo_rewards_rejected", "orpo_rewards_margin",
        "orpo_rewards_accuracy", "orpo_nll_loss", "orpo_log_odds_ratio", "orpo_log_odds_chosen"}}};
  return files;
}
}  // namespace

void CSVLogger::log_metrics(const MetricsRow& row, const std::map<std::string, double>& extra) {
  writer_.write(row);
  const auto& files = side_files();
  side_.resize(files.size(), nullptr);
  for (size_t i = 0; i < files.size(); ++i) {
    const SideFile& f = files[i];
    if (!extra.count(f.columns[0])) continue;
    if (!side_[i]) {
      const std::string p = (fs::path(path_).parent_path() / f.name).string();
      side_[i] = std::fopen(p.c_str(), "w");
      if (!side_[i]) throw IoError(str("[csv_logger] cannot write ", p));
      std::fprintf(side_[i], "step");
      for (const char* c : f.columns) std::fprintf(side_[i], ",%s", c);
      std::fprintf(side_[i], "\n");
    }
    std::fprintf(side_[i], "%lld", static_cast<long long>(row.step));
    for (const char* c : f.columns) {
      const auto it = extra.find(c);
      std::fprintf(side_[i], ",%.9g", it == extra.end() ? 0.0 : it->second);
    }
    std::fprintf(side_[i], "\n");
    std::fflush(side_[i]);
  }
}

// ---- TFRecord and the Event protobuf ----

namespace tfrecord {

namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // Castagnoli
    t[i] = c;
  }
  return t;
}

void put_varint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
}
template <class T>
void put_fixed(std::string& s, T v) {  // little-endian (the build targets are)
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  s.append(b, sizeof(T));
}
void put_tag(std::string& s, int field, int wire) {
  put_varint(s, (field << 3) | wire);
}
void put_bytes(std::string& s, int field, const std::string& b) {
  put_tag(s, field, 2);
  put_varint(s, b.size());
  s += b;
}

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_tag(e, 1, 1);  // wall_time: double
  put_fixed(e, wall_time);
  put_tag(e, 2, 0);  // step: int64
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string frame(const std::string& data) {
  std::string r;
  const uint64_t len = data.size();
  put_fixed(r, len);
  put_fixed(r, masked_crc32c(r.data(), 8));
  r += data;
  put_fixed(r, masked_crc32c(data.data(), data.size()));
  return r;
}

std::string event_file_version(double wall_time) {
  std::string e = event_header(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string event_scalars(double wall_time, int64_t step,
                          const std::map<std::string, double>& scalars) {
  std::string summary;
  for (const auto& [tag, v] : scalars) {
    std::string value;
    put_bytes(value, 1, tag);
    put_tag(value, 2, 5);  // simple_value: float
    put_fixed(value, static_cast<float>(v));
    put_bytes(summary, 1, value);
  }
  std::string e = event_header(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

std::string event_text(double wall_time, const std::string& tag, const std::string& text) {
  std::string plugin, metadata, shape, tensor, value, summary;
  put_bytes(plugin, 1, "text");    // PluginData.plugin_name
  put_bytes(metadata, 1, plugin);  // SummaryMetadata.plugin_data
  put_tag(tensor, 1, 0);           // TensorProto.dtype = DT_STRING
  put_varint(tensor, 7);
  put_bytes(tensor, 2, shape);  // a scalar: no dims
  put_bytes(tensor, 8, text);   // string_val
  put_bytes(value, 1, tag);
  put_bytes(value, 9, metadata);
  put_bytes(value, 8, tensor);
  put_bytes(summary, 1, value);
  std::string e = event_header(wall_time, 0);
  put_bytes(e, 5, summary);
  return e;
}

}  // namespace tfrecord

// ---- TensorBoard ----

std::map<std::string, double> tensorboard_scalars(const MetricsRow& row,
                                                  const std::map<std::string, double>& extra) {
  std::map<std::string, double> s{{"lr", row.lr},
                                  {"grad_norm", row.grad_norm},
                                  {"tokens_per_s", row.tokens_per_s},
                                  {"epoch", static_cast<double>(row.epoch)}};
  if (!std::isnan(row.loss)) s["loss"] = row.loss;  // NaN: an evaluation-only row
  if (row.val_loss) s["val_loss"] = *row.val_loss;
  if (row.sim_step_s) s["sim_step_ms"] = *row.sim_step_s * 1e3;
  if (row.hbm_peak_bytes) s["hbm_peak_mib"] = static_cast<double>(*row.hbm_peak_bytes) / (1 << 20);
  for (const auto& [k, v] : extra) s[k] = v;
  return s;
}

TensorBoardLogger::TensorBoardLogger(const std::string& dir) {
  static std::atomic<int> counter{0};
  const std::string tb = (fs::path(dir) / "tensorboard").string();
  create_dir(tb, "tensorboard");
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const double now = wall_now();
  path_ = (fs::path(tb) / str("events.out.tfevents.", static_cast<int64_t>(now), ".", host, ".",
                              getpid(), ".", counter++))
              .string();
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) throw IoError(str("[tensorboard] cannot create '", path_, "': ", std::strerror(errno)));
  write_record(tfrecord::event_file_version(now));
}

TensorBoardLogger::~TensorBoardLogger() {
  if (f_) std::fclose(f_);
}

void TensorBoardLogger::write_record(const std::string& data) {
  const std::string r = tfrecord::frame(data);
  if (std::fwrite(r.data(), 1, r.size(), f_) != r.size() || std::fflush(f_) != 0)
    throw IoError(str("[tensorboard] cannot write '", path_, "': ", std::strerror(errno)));
}

void TensorBoardLogger::log_hyperparams(const std::string& yaml) {
  // TensorBoard's text plugin renders markdown: a code block keeps the YAML's layout
  write_record(tfrecord::event_text(wall_now(), "config", "```\n" + yaml + "```"));
}

void TensorBoardLogger::log_metrics(const MetricsRow& row,
                                    const std::map<std::string, double>& extra) {
  write_record(tfrecord::event_scalars(wall_now(), row.step, tensorboard_scalars(row, extra)));
}

void TensorBoardLogger::finalize() {
  if (f_) std::fflush(f_);
}

}  // namespace nxd::trainer

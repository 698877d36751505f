#pragma once
// Loggers: where the trainer's metrics go. The trainer calls them on its logging rank only (DP
// rank 0, TP rank 0, the last pipeline stage).
//   CSVLogger          <dir>/metrics.csv (MetricsWriter's columns)
//   TensorBoardLogger  <dir>/tensorboard/events.out.tfevents.<seconds>.<host>: TFRecord framing
//                      (length, masked CRC32C of the length, data, masked CRC32C of the data) of
//                      Event protobufs: a file_version record, then one Event per logged step
//                      with a Summary of simple_value scalars. TensorBoard opens the folder.
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "nxd/trainer/log.h"

namespace nxd::trainer {

class Logger {
 public:
  virtual ~Logger() = default;
  // The resolved configuration (YAML), once before training.
  virtual void log_hyperparams(const std::string& yaml) { (void)yaml; }
  // One logged step; `extra` holds the scalars callbacks and the module logged since the last
  // row (Trainer::log), by name.
  virtual void log_metrics(const MetricsRow& row, const std::map<std::string, double>& extra) = 0;
  virtual void finalize() {}
};

class CSVLogger : public Logger {
 public:
  explicit CSVLogger(const std::string& dir);  // creates dir; throws IoError
  void log_metrics(const MetricsRow& row, const std::map<std::string, double>& extra) override;
  std::string path() const { return path_; }

 private:
  std::string path_;
  MetricsWriter writer_;
  // side files of a module's extras, once a row carries them: moe_metrics.csv (MoE models),
  // sft_metrics.csv (SFT token counts), dpo_metrics.csv (DPO rewards)
  std::vector<std::FILE*> side_;

 public:
  ~CSVLogger() override;
};

// The scalars of a row, by TensorBoard tag: loss, val_loss (validation rows), lr, grad_norm,
// tokens_per_s, sim_step_ms (modeled step time), hbm_peak_mib (device-memory peak), epoch, then
// the extras.
std::map<std::string, double> tensorboard_scalars(const MetricsRow& row,
                                                  const std::map<std::string, double>& extra);

class TensorBoardLogger : public Logger {
 public:
  // Creates <dir>/tensorboard/ and the event file; throws IoError naming the path.
  explicit TensorBoardLogger(const std::string& dir);
  ~TensorBoardLogger() override;
  TensorBoardLogger(const TensorBoardLogger&) = delete;
  TensorBoardLogger& operator=(const TensorBoardLogger&) = delete;
  void log_hyperparams(const std::string& yaml) override;
  void log_metrics(const MetricsRow& row, const std::map<std::string, double>& extra) override;
  void finalize() override;
  std::string path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* f_ = nullptr;
};

// ---- the formats, exposed for tests and readers ----
namespace tfrecord {
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
uint32_t masked_crc32c(const void* data, size_t n);
// One record: u64 length, u32 masked crc of the length bytes, data, u32 masked crc of data.
std::string frame(const std::string& data);
// tensorflow.Event {wall_time=1, step=2, file_version=3 | summary=5}; Summary {value=1};
// Summary.Value {tag=1, simple_value=2 (float)}; a text summary for hyperparameters.
std::string event_file_version(double wall_time);
std::string event_scalars(double wall_time, int64_t step,
                          const std::map<std::string, double>& scalars);
std::string event_text(double wall_time, const std::string& tag, const std::string& text);
}  // namespace tfrecord

}  // namespace nxd::trainer

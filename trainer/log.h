#pragma once
// Training logs: DIR/metrics.csv (one row per logged step) and the terminal progress bar.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace nxd::trainer {

struct MetricsRow {
  int64_t step = 0;
  double loss = 0;                        // mean training loss over the step's global batch
  std::optional<double> val_loss;         // on validation steps only
  double lr = 0;                          // the rate used by this step's update
  double grad_norm = 0;                   // global L2 norm before clipping
  double tokens_per_s = 0;                // training tokens per second over the logging interval
  int64_t epoch = 0;                      // epoch of the last micro batch
  double elapsed_s = 0;                   // since training started
  std::optional<double> sim_step_s;       // sim backend: modeled seconds of the last step (rank 0)
  std::optional<int64_t> hbm_peak_bytes;  // sim backend: the logging rank's device-memory peak
                                          // so far (TensorBoard only; not a metrics.csv column)
};

// Columns: step,loss,val_loss,lr,grad_norm,tokens_per_s,epoch,elapsed_s,sim_step_s (sim_step_s
// is empty without a simulated device). Losses, lr and the norm are written with 9 significant
// digits (a float round-trips); val_loss is empty on rows without validation. Each row is
// flushed, so a crashed run keeps its rows.
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path);  // throws IoError
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const MetricsRow& row);
  static std::string header();
  static std::string format(const MetricsRow& row);

 private:
  std::FILE* f_;
  std::string path_;
};

// step, loss, lr, tokens/s and ETA. On a terminal (isatty) one line redrawn in place; otherwise
// one plain line per update.
class ProgressBar {
 public:
  ProgressBar(int64_t total_steps, bool tty, std::FILE* out = stdout);
  static bool stdout_is_tty();
  void update(const MetricsRow& row);
  // Prints a line of its own (above the bar on a terminal).
  void message(const std::string& line);
  void finish();  // ends the bar's line

 private:
  std::string render(const MetricsRow& row) const;
  int64_t total_;
  bool tty_;
  std::FILE* out_;
  std::string last_;
  std::optional<double> last_val_;
};

std::string format_duration(double seconds);  // "1:05", "1:02:03"

}  // namespace nxd::trainer

#include "nxd/trainer/log.h"

#include <unistd.h>

#include <cmath>

#include "nxd/runtime/error.h"

namespace nxd::trainer {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) s = 0;
  const auto t = static_cast<int64_t>(std::llround(s));
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(t / 3600),
                  static_cast<long long>(t / 60 % 60), static_cast<long long>(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(t / 60),
                  static_cast<long long>(t % 60));
  return buf;
}

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) throw IoError(str("[log] cannot write '", path, "'"));
  std::fprintf(f_, "%s\n", header().c_str());
  std::fflush(f_);
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

std::string MetricsWriter::header() {
  return "step,loss,val_loss,lr,grad_norm,tokens_per_s,epoch,elapsed_s,sim_step_s";
}

std::string MetricsWriter::format(const MetricsRow& r) {
  char val[40] = "";
  if (r.val_loss) std::snprintf(val, sizeof val, "%.9g", *r.val_loss);
  char loss[40] = "";  // empty on evaluation-only rows (NaN)
  if (!std::isnan(r.loss)) std::snprintf(loss, sizeof loss, "%.9g", r.loss);
  char sim[40] = "";
  if (r.sim_step_s) std::snprintf(sim, sizeof sim, "%.6g", *r.sim_step_s);
  char buf[300];
  std::snprintf(buf, sizeof buf, "%lld,%s,%s,%.9g,%.9g,%.1f,%lld,%.3f,%s",
                static_cast<long long>(r.step), loss, val, r.lr, r.grad_norm, r.tokens_per_s,
                static_cast<long long>(r.epoch), r.elapsed_s, sim);
  return buf;
}

void MetricsWriter::write(const MetricsRow& r) {
  const std::string line = format(r);
  if (std::fprintf(f_, "%s\n", line.c_str()) < 0 || std::fflush(f_) != 0)
    throw IoError(str("[log] error writing '", path_, "'"));
}

ProgressBar::ProgressBar(int64_t total, bool tty, std::FILE* out)
    : total_(total), tty_(tty), out_(out) {}

bool ProgressBar::stdout_is_tty() {
  return isatty(STDOUT_FILENO) == 1;
}

std::string ProgressBar::render(const MetricsRow& r) const {
  const double frac = total_ > 0 ? static_cast<double>(r.step) / total_ : 1.0;
  const double eta = r.step > 0 ? r.elapsed_s / r.step * (total_ - r.step) : 0.0;
  char tok[32];
  if (r.tokens_per_s >= 1e4)
    std::snprintf(tok, sizeof tok, "%.1fk", r.tokens_per_s / 1e3);
  else
    std::snprintf(tok, sizeof tok, "%.0f", r.tokens_per_s);
  char sim[48] = "";
  if (r.sim_step_s) std::snprintf(sim, sizeof sim, " (sim %.2f ms/step)", *r.sim_step_s * 1e3);
  char val[48] = "";
  if (last_val_) std::snprintf(val, sizeof val, " val %.4f", *last_val_);
  char buf[400];
  if (tty_) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(filled, '#');
    bar += std::string(kWidth - filled, '.');
    std::snprintf(buf, sizeof buf, "[%s] %lld/%lld loss %.4f%s lr %.2e %s tok/s%s ETA %s",
                  bar.c_str(), static_cast<long long>(r.step), static_cast<long long>(total_),
                  r.loss, val, r.lr, tok, sim, format_duration(eta).c_str());
  } else {
    std::snprintf(buf, sizeof buf,
                  "step %lld/%lld loss %.4f%s lr %.2e grad_norm %.3f %s tok/s%s "
                  "elapsed %s ETA %s",
                  static_cast<long long>(r.step), static_cast<long long>(total_), r.loss, val, r.lr,
                  r.grad_norm, tok, sim, format_duration(r.elapsed_s).c_str(),
                  format_duration(eta).c_str());
  }
  return buf;
}

void ProgressBar::update(const MetricsRow& r) {
  if (r.val_loss) last_val_ = r.val_loss;
  last_ = render(r);
  if (tty_)
    std::fprintf(out_, "\r\033[K%s", last_.c_str());
  else
    std::fprintf(out_, "%s\n", last_.c_str());
  std::fflush(out_);
}

void ProgressBar::message(const std::string& line) {
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s\n%s", line.c_str(), last_.c_str());
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (tty_ && !last_.empty()) std::fprintf(out_, "\n");
  std::fflush(out_);
}

}  // namespace nxd::trainer

#include "nxd/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "nxd/runtime/error.h"

namespace nxd::optim {

ScheduleKind schedule_kind_from_name(const std::string& name) {
  if (name == "constant") return ScheduleKind::constant;
  if (name == "linear" || name == "LinearAnnealingWithWarmUp") return ScheduleKind::linear;
  if (name == "cosine" || name == "CosineAnnealing") return ScheduleKind::cosine;
  throw ConfigError(
      str("[lr_schedule] unknown schedule '", name, "': expected constant, linear or cosine"));
}

const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::constant:
      return "constant";
    case ScheduleKind::linear:
      return "linear";
    case ScheduleKind::cosine:
      return "cosine";
  }
  return "?";
}

LRSchedule::LRSchedule(LRScheduleOptions opts) : opts_(opts) {
  NXD_CHECK(opts_.lr >= 0 && std::isfinite(opts_.lr),
            "[lr_schedule] lr must be finite and >= 0, got ", opts_.lr);
  NXD_CHECK(opts_.min_lr >= 0 && opts_.min_lr <= opts_.lr,
            "[lr_schedule] min_lr must be in [0, lr]: min_lr=", opts_.min_lr, " lr=", opts_.lr);
  NXD_CHECK(opts_.warmup_steps >= 0, "[lr_schedule] warmup_steps must be >= 0, got ",
            opts_.warmup_steps);
  NXD_CHECK(opts_.kind == ScheduleKind::constant || opts_.decay_steps >= opts_.warmup_steps,
            "[lr_schedule] warmup_steps=", opts_.warmup_steps, " exceeds the decay steps ",
            opts_.decay_steps);
}

double LRSchedule::lr(int64_t step) const {
  const auto& o = opts_;
  if (step < 0) step = 0;
  if (step < o.warmup_steps)
    return o.lr * static_cast<double>(step) / static_cast<double>(o.warmup_steps);
  if (o.kind == ScheduleKind::constant) return o.lr;
  if (step >= o.decay_steps) return o.min_lr;
  const double p = static_cast<double>(step - o.warmup_steps) /
                   static_cast<double>(o.decay_steps - o.warmup_steps);
  const double f =
      o.kind == ScheduleKind::linear ? 1.0 - p : 0.5 * (1.0 + std::cos(std::numbers::pi * p));
  return o.min_lr + (o.lr - o.min_lr) * f;
}

}  // namespace nxd::optim

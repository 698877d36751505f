#pragma once
// Learning-rate schedules as pure functions of the step: lr(s) is the rate used by update number
// s (s = 0 for the first optimizer step), so a resumed run needs only the step count.
//
// With W = warmup_steps, T = total steps (decay_steps), lr_max = base lr, lr_min = min_lr:
//   s < W:        lr = lr_max * s / W                      (Hugging Face warmup: lr(0) = 0)
//   constant:     lr = lr_max                              for s >= W
//   linear:       lr = lr_min + (lr_max - lr_min) * (1 - p)
//   cosine:       lr = lr_min + (lr_max - lr_min) * (1 + cos(pi * p)) / 2
//                 with p = (s - W) / (T - W), clamped to [0, 1]; lr = lr_min for s >= T.
// So lr(W) = lr_max exactly and lr(T) = lr_min exactly. NxD Training's names are accepted:
// "LinearAnnealingWithWarmUp" = linear, "CosineAnnealing" = cosine.
#include <cstdint>
#include <string>

namespace nxd::optim {

enum class ScheduleKind { constant, linear, cosine };

// "constant" | "linear" | "cosine" (and the NxD Training aliases); throws ConfigError.
ScheduleKind schedule_kind_from_name(const std::string& name);
const char* schedule_kind_name(ScheduleKind k);

struct LRScheduleOptions {
  ScheduleKind kind = ScheduleKind::constant;
  double lr = 1e-3;     // lr_max
  double min_lr = 0.0;  // the floor of linear / cosine decay
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  // T: where decay reaches min_lr (usually trainer.max_steps)
};

class LRSchedule {
 public:
  explicit LRSchedule(LRScheduleOptions opts);  // checks the options (InvalidArgument)
  double lr(int64_t step) const;
  const LRScheduleOptions& options() const { return opts_; }

 private:
  LRScheduleOptions opts_;
};

}  // namespace nxd::optim

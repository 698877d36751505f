#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "nxd/optim/lr_schedule.h"
#include "nxd/runtime/error.h"

using namespace nxd;
using namespace nxd::optim;

TEST(LRSchedule, ConstantWithWarmup) {
  LRSchedule s({ScheduleKind::constant, 0.1, 0.0, 4, 0});
  EXPECT_EQ(s.lr(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(1), 0.025);
  EXPECT_DOUBLE_EQ(s.lr(3), 0.075);
  EXPECT_EQ(s.lr(4), 0.1);
  EXPECT_EQ(s.lr(1000000), 0.1);
  LRSchedule flat({ScheduleKind::constant, 0.1, 0.0, 0, 0});
  EXPECT_EQ(flat.lr(0), 0.1);
}

TEST(LRSchedule, LinearBoundaries) {
  // warmup 10, decay to 0.01 at step 110
  LRSchedule s({ScheduleKind::linear, 1.0, 0.01, 10, 110});
  EXPECT_EQ(s.lr(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(5), 0.5);
  EXPECT_EQ(s.lr(10), 1.0);                              // end of warmup: the peak exactly
  EXPECT_DOUBLE_EQ(s.lr(11), 0.01 + 0.99 * (1 - 0.01));  // one step into decay
  EXPECT_DOUBLE_EQ(s.lr(60), 0.01 + 0.99 * 0.5);
  EXPECT_EQ(s.lr(110), 0.01);  // last: the floor exactly
  EXPECT_EQ(s.lr(500), 0.01);
}

TEST(LRSchedule, CosineBoundaries) {
  LRSchedule s({ScheduleKind::cosine, 2.0, 0.2, 4, 20});
  EXPECT_EQ(s.lr(0), 0.0);
  EXPECT_EQ(s.lr(4), 2.0);
  EXPECT_DOUBLE_EQ(s.lr(5), 0.2 + 1.8 * 0.5 * (1 + std::cos(std::numbers::pi / 16)));
  EXPECT_DOUBLE_EQ(s.lr(12), 0.2 + 1.8 * 0.5);  // halfway
  EXPECT_EQ(s.lr(20), 0.2);
  EXPECT_EQ(s.lr(21), 0.2);
  // monotone non-increasing after warmup
  for (int i = 4; i < 25; ++i) EXPECT_GE(s.lr(i), s.lr(i + 1)) << i;
}

TEST(LRSchedule, NoWarmupStartsAtPeak) {
  LRSchedule s({ScheduleKind::cosine, 1e-3, 0.0, 0, 100});
  EXPECT_EQ(s.lr(0), 1e-3);
  EXPECT_EQ(s.lr(100), 0.0);
}

TEST(LRSchedule, NamesAndErrors) {
  EXPECT_EQ(schedule_kind_from_name("cosine"), ScheduleKind::cosine);
  EXPECT_EQ(schedule_kind_from_name("LinearAnnealingWithWarmUp"), ScheduleKind::linear);
  EXPECT_EQ(schedule_kind_from_name("CosineAnnealing"), ScheduleKind::cosine);
  EXPECT_THROW(schedule_kind_from_name("step"), ConfigError);
  EXPECT_THROW(LRSchedule({ScheduleKind::linear, 1.0, 2.0, 0, 10}), InvalidArgument);
  EXPECT_THROW(LRSchedule({ScheduleKind::linear, 1.0, 0.0, 20, 10}), InvalidArgument);
}

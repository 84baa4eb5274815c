#include "kernels/engine/step_wait.h"

#include <gtest/gtest.h>

namespace mx {
namespace {

using std::chrono::microseconds;

TEST(StepWait, BucketsAreLog2) {
  EXPECT_EQ(StepWait::bucket(0), 0);
  EXPECT_EQ(StepWait::bucket(1), 0);
  EXPECT_EQ(StepWait::bucket(2), 1);
  EXPECT_EQ(StepWait::bucket(255), 7);
  EXPECT_EQ(StepWait::bucket(256), 8);
  EXPECT_EQ(StepWait::bucket(1 << 30), 19);  // the last bucket takes the rest
}

TEST(StepWait, FirstStepOfABucketSpins) {
  StepWait w;
  const auto t0 = StepWait::Clock::now();
  EXPECT_EQ(w.wake_at(256, t0), t0);
}

TEST(StepWait, ShortStepsNeverSleep) {
  StepWait w;
  for (int i = 0; i < 10; ++i) w.record(8, microseconds(1500), false);
  const auto t0 = StepWait::Clock::now();
  EXPECT_EQ(w.wake_at(8, t0), t0);
}

TEST(StepWait, LongStepsSleepAllButTheMargin) {
  StepWait w;
  w.record(256, microseconds(30000), false);
  const auto t0 = StepWait::Clock::now();
  EXPECT_EQ(w.wake_at(256, t0) - t0, microseconds(27000));  // 10 % of 30 ms > 0.5 ms
  EXPECT_EQ(w.wake_at(300, t0) - t0, microseconds(27000));  // the same bucket
  EXPECT_EQ(w.wake_at(512, t0), t0);                        // another bucket: nothing known yet
  StepWait v;
  v.record(64, microseconds(4000), false);
  EXPECT_EQ(v.wake_at(64, t0) - t0, microseconds(3500));  // the 0.5 ms floor
}

TEST(StepWait, EstimateFollowsAndShrinksWhenLate) {
  StepWait w;
  w.record(128, microseconds(20000), false);
  w.record(128, microseconds(24000), false);
  EXPECT_DOUBLE_EQ(w.estimate_us(128), 21000.0);
  w.record(128, microseconds(90000), true);  // woke after the end: the long duration is not taken
  EXPECT_DOUBLE_EQ(w.estimate_us(128), 18900.0);
  w.record(128, microseconds(12000), true);  // ended before 12 ms: below that at once
  EXPECT_DOUBLE_EQ(w.estimate_us(128), 10800.0);
}

}  // namespace
}  // namespace mx

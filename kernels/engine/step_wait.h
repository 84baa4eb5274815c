// How long the host sleeps before it spins on a step's completion event. A spinning wait holds a core
// for the whole step and a blocking one (cudaEventBlockingSync) wakes late (wide steps lost ~2 %,
// docs/perf.md session 29), so the host sleeps through most of a long step, on an estimate of its length
// per token bucket, and spins for the rest. Plain C++ (tested on the CPU).
#pragma once

#include <array>
#include <chrono>

namespace mx {

class StepWait {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kMinSleepUs = 2000;  // steps shorter than this (graph steps, small prefills) spin
  static constexpr double kMarginUs = 500;     // the least spin at a step's end (a wake-up overshoots ~0.1 ms)
  // The host sleeps in slices and looks at the step's event after each: an estimate too long costs one.
  static constexpr std::chrono::microseconds kSlice{500};

  // The bucket of a step of m tokens: floor(log2(m)).
  static int bucket(int m) {
    int b = 0;
    while (m > 1 && b < int(kBuckets) - 1) m >>= 1, ++b;
    return b;
  }
  // When the host stops sleeping for a step of m tokens enqueued at t0 (t0 itself: don't sleep).
  Clock::time_point wake_at(int m, Clock::time_point t0) const {
    const double est = est_us_[size_t(bucket(m))];
    if (est < kMinSleepUs) return t0;
    const double margin = est * 0.1 > kMarginUs ? est * 0.1 : kMarginUs;
    return t0 + std::chrono::microseconds(long(est - margin));
  }
  // After the wait: the step took `d` from its enqueue to the host seeing it done; `late`: it had
  // finished before the host woke, so it took less than d: the estimate drops below d at once (a slow
  // outlier, a first use of a kernel, must not keep the next steps sleeping past their ends).
  void record(int m, Clock::duration d, bool late) {
    double& est = est_us_[size_t(bucket(m))];
    const double us = std::chrono::duration<double, std::micro>(d).count();
    if (late)
      est = 0.9 * (us < est ? us : est);
    else
      est = est == 0 ? us : 0.75 * est + 0.25 * us;
  }
  double estimate_us(int m) const { return est_us_[size_t(bucket(m))]; }

 private:
  static constexpr size_t kBuckets = 20;
  std::array<double, kBuckets> est_us_{};  // 0: none yet
};

}  // namespace mx

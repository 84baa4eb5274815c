// Prometheus text metrics with vLLM's names (prefix "vllm:" so existing dashboards work).
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <string>

#include "runtime/engine.h"

namespace mx::server {

class Histogram {
 public:
  static constexpr std::array<double, 12> kBounds = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  void observe(double v);
  std::string text(const std::string& name, const std::string& labels) const;

 private:
  std::array<uint64_t, kBounds.size()> counts_{};
  uint64_t n_ = 0;
  double sum_ = 0;
};

class Metrics {
 public:
  void ttft(double s);
  void itl(double s);
  void e2e(double s);
  std::string text(const std::string& model, const runtime::EngineStats& st) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, itl_, e2e_;
};

}  // namespace mx::server

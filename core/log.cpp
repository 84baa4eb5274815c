#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "core/error.h"

namespace mx::log {
namespace {
std::atomic<Level> g_level{Level::kInfo};
std::mutex g_mu;
const char* tag(Level l) {
  switch (l) {
    case Level::kDebug: return "D";
    case Level::kInfo: return "I";
    case Level::kWarn: return "W";
    case Level::kError: return "E";
    default: return "?";
  }
}
}  // namespace

void set_level(Level level) { g_level = level; }
Level level() { return g_level; }

Level parse_level(std::string_view n) {
  if (n == "debug") return Level::kDebug;
  if (n == "info") return Level::kInfo;
  if (n == "warn") return Level::kWarn;
  if (n == "error") return Level::kError;
  if (n == "off") return Level::kOff;
  fail("unknown log level '{}' (debug|info|warn|error|off)", n);
}

void write(Level l, std::string_view msg) {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t t = system_clock::to_time_t(now);
  int ms = int(duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::lock_guard lock(g_mu);
  std::fprintf(stderr, "%s %02d:%02d:%02d.%03d %.*s\n", tag(l), tm.tm_hour, tm.tm_min, tm.tm_sec,
               ms, int(msg.size()), msg.data());
}

}  // namespace mx::log

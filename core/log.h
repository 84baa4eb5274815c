// Minimal leveled logging to stderr. Level is set once by the CLI (--log-level).
#pragma once
#include <fmt/format.h>
#include <string_view>

namespace mx::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_level(Level level);
Level level();
Level parse_level(std::string_view name);  // throws mx::Error on an unknown name
void write(Level level, std::string_view msg);

template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... a) {
  if (level() <= Level::kInfo) write(Level::kInfo, fmt::format(f, std::forward<Args>(a)...));
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... a) {
  if (level() <= Level::kWarn) write(Level::kWarn, fmt::format(f, std::forward<Args>(a)...));
}
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... a) {
  if (level() <= Level::kError) write(Level::kError, fmt::format(f, std::forward<Args>(a)...));
}
template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... a) {
  if (level() <= Level::kDebug) write(Level::kDebug, fmt::format(f, std::forward<Args>(a)...));
}

}  // namespace mx::log

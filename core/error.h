// Errors: one exception type whose message is a single line a user can act on.
// Load-time and request-validation code throws mx::Error; the CLI (or the server's
// request handler) catches it at the top and prints / returns it. Hot loops never throw.
#pragma once
#include <stdexcept>
#include <string>
#include <fmt/format.h>

namespace mx {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

template <class... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> fmt, Args&&... args) {
  throw Error(fmt::format(fmt, std::forward<Args>(args)...));
}

}  // namespace mx

#define MX_CHECK(cond, ...)                       \
  do {                                            \
    if (!(cond)) ::mx::fail(__VA_ARGS__);         \
  } while (0)

namespace mx {

// A client request that is invalid: `param` names the offending field (OpenAI error body's
// "param"), e.g. "messages[2].role" or "temperature". Servers answer 400 with it.
class InvalidRequest : public Error {
 public:
  InvalidRequest(std::string param, const std::string& msg) : Error(msg), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

}  // namespace mx

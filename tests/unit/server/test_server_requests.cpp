// Request options end to end through the HTTP server on the fake runner (tokens count up by one):
// ignore_eos, the vLLM extension load benchmarks use, keeps generating through the model's eos ids.
#include <gtest/gtest.h>

#include "tests/unit/server/fake_server.h"

namespace mx::server {
namespace {

TEST(ServerRequests, IgnoreEosGeneratesThroughTheEosIds) {
  if (tokenizer_path().empty()) GTEST_SKIP() << ".assets/tokenizer/tokenizer.json missing";
  FakeServer fs(ServerOptions{}, {10});  // eos id 10: the prompt [5, 6, 7] reaches it third
  const int port = fs.port();

  const std::string stops = http(port, "POST", "/v1/completions", R"({"prompt": [5, 6, 7], "max_tokens": 8})");
  EXPECT_NE(stops.find(R"("completion_tokens":3)"), std::string::npos) << stops;
  EXPECT_NE(stops.find(R"("finish_reason":"stop")"), std::string::npos) << stops;
  for (const char* stream : {"false", "true"}) {
    SCOPED_TRACE(stream);
    const std::string body = std::string(R"({"prompt": [5, 6, 7], "max_tokens": 8, "ignore_eos": true, "stream": )") +
                             stream + R"(, "stream_options": {"include_usage": true}})";
    const std::string r = http(port, "POST", "/v1/completions", body);
    EXPECT_NE(r.find(R"("completion_tokens":8)"), std::string::npos) << r;
    EXPECT_NE(r.find(R"("finish_reason":"length")"), std::string::npos) << r;
  }
  // A request's own stop_token_ids still stop it.
  const std::string own = http(port, "POST", "/v1/completions",
                               R"({"prompt": [5, 6, 7], "max_tokens": 8, "ignore_eos": true, "stop_token_ids": [12]})");
  EXPECT_NE(own.find(R"("completion_tokens":5)"), std::string::npos) << own;
  EXPECT_NE(own.find(R"("finish_reason":"stop")"), std::string::npos) << own;
  const std::string bad = http(port, "POST", "/v1/completions", R"({"prompt": [5], "ignore_eos": "yes"})");
  EXPECT_NE(bad.find("400"), std::string::npos) << bad;
  EXPECT_NE(bad.find("ignore_eos"), std::string::npos) << bad;
}

}  // namespace
}  // namespace mx::server

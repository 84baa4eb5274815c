// A fault while generating (ServerOptions::fault_after_tokens: the request's consumer throws) ends
// that request with an error, streaming or not, on every generating route, and the server, the
// engine and the other requests go on; nothing stays running and the KV is freed.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "tests/unit/server/fake_server.h"

namespace mx::server {
namespace {

TEST(ServerFaults, AFaultWhileGeneratingEndsOnlyThatRequest) {
  if (tokenizer_path().empty()) GTEST_SKIP() << ".assets/tokenizer/tokenizer.json missing";
  ServerOptions opt;
  opt.http_threads = 16;
  opt.fault_after_tokens = 3;
  FakeServer fs(opt, {});
  runtime::Engine& engine = fs.engine;
  const int port = fs.port();

  struct Case { const char* path; std::string body; const char* want; };
  const std::string chat = R"("messages": [{"role": "user", "content": "hi"}])";
  const std::vector<Case> faulted = {
      {"/v1/completions", R"({"prompt": [5, 6, 7], "max_tokens": 8, "stream": true})", "data: {\"error\""},
      {"/v1/completions", R"({"prompt": [5, 6, 7], "max_tokens": 8})", "{\"error\""},
      {"/v1/chat/completions", "{" + chat + R"(, "max_tokens": 8, "stream": true})", "data: {\"error\""},
      {"/v1/chat/completions", "{" + chat + R"(, "max_tokens": 8})", "{\"error\""},
      {"/v1/responses", R"({"input": "hi", "max_output_tokens": 8, "stream": true})", "event: error"},
      {"/v1/responses", R"({"input": "hi", "max_output_tokens": 8})", "{\"error\""},
  };
  for (const Case& c : faulted) {
    SCOPED_TRACE(std::string(c.path) + " " + c.body);
    const std::string r = http(port, "POST", c.path, c.body);
    EXPECT_NE(r.find(c.want), std::string::npos) << r;
    EXPECT_NE(r.find("internal error while generating: injected fault"), std::string::npos) << r;
    EXPECT_EQ(r.find("[DONE]"), std::string::npos) << r;
  }
  // Requests that stop before the fault still complete, and the server still answers.
  const std::string ok = http(port, "POST", "/v1/completions", R"({"prompt": [5, 6, 7], "max_tokens": 2})");
  EXPECT_NE(ok.find("\"choices\""), std::string::npos) << ok;
  EXPECT_EQ(ok.find("\"error\""), std::string::npos) << ok;
  EXPECT_NE(http(port, "GET", "/health", "").find("ok"), std::string::npos);
  // The aborted requests leave the engine: nothing running, the KV back to empty.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((engine.stats().running > 0 || engine.stats().kv_usage > 0) && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(engine.stats().running, 0);
  EXPECT_EQ(engine.stats().kv_usage, 0.0);
}

}  // namespace
}  // namespace mx::server

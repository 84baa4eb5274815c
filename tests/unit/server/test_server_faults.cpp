// A fault while generating (ServerOptions::fault_after_tokens: the request's consumer throws) ends
// that request with an error, streaming or not, on every generating route, and the server, the
// engine and the other requests go on; nothing stays running and the KV is freed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "runtime/engine.h"
#include "server/server.h"
#include "tests/unit/runtime/fake_runner.h"
#include "tokenizer/tokenizer.h"

namespace mx::server {
namespace {

// One HTTP/1.1 exchange with Connection: close; returns the raw response (status line, headers,
// chunked body) or "" when the server does not answer within 20 s.
std::string http(int port, const std::string& method, const std::string& path, const std::string& body) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  timeval tv{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                            "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                            "\r\n\r\n" + body;
    ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

TEST(ServerFaults, AFaultWhileGeneratingEndsOnlyThatRequest) {
  const auto path = std::filesystem::path(MX_SOURCE_DIR) / ".assets/tokenizer/tokenizer.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << ".assets/tokenizer/tokenizer.json missing";
  runtime::fake::FakeRunner runner(512);
  runtime::Engine engine(runner, {.max_num_seqs = 8, .max_num_batched_tokens = 256});
  ServerOptions opt;
  opt.port = 0;
  opt.model_name = "fake";
  opt.http_threads = 16;
  opt.fault_after_tokens = 3;
  Server srv(opt);
  ASSERT_TRUE(srv.bind());
  std::thread listener([&] { srv.listen(); });
  srv.attach(&engine, Tokenizer::load(path.string()), {});
  engine.start();
  const int port = srv.port();

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
  srv.stop();
  listener.join();
}

}  // namespace
}  // namespace mx::server

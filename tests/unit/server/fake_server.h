// The server tests' harness: the HTTP server on 127.0.0.1 over an engine on the fake runner (tokens count
// up by one, tests/unit/runtime/fake_runner.h) with the real tokenizer, and a minimal HTTP client.
#pragma once
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "server/server.h"
#include "tests/unit/runtime/fake_runner.h"
#include "tokenizer/tokenizer.h"

namespace mx::server {

// The tokenizer the server needs; empty when .assets is missing (the test skips).
inline std::string tokenizer_path() {
  const auto path = std::filesystem::path(MX_SOURCE_DIR) / ".assets/tokenizer/tokenizer.json";
  return std::filesystem::exists(path) ? path.string() : "";
}

// Listening on any free port from construction to destruction.
struct FakeServer {
  runtime::fake::FakeRunner runner{512};
  runtime::Engine engine{runner, {.max_num_seqs = 8, .max_num_batched_tokens = 256}};
  Server srv;
  std::thread listener;
  FakeServer(const ServerOptions& opt, std::vector<int32_t> eos_ids) : srv(local(opt)) {
    EXPECT_TRUE(srv.bind());
    listener = std::thread([this] { srv.listen(); });
    srv.attach(&engine, Tokenizer::load(tokenizer_path()), std::move(eos_ids));
    engine.start();
  }
  ~FakeServer() {
    srv.stop();
    listener.join();
  }
  int port() { return srv.port(); }
  static ServerOptions local(ServerOptions o) {
    o.port = 0;  // any free port
    o.model.primary = "fake";
    return o;
  }
};

// One HTTP/1.1 exchange with Connection: close; returns the raw response (status line, headers,
// chunked body) or "" when the server does not answer within 20 s.
inline std::string http(int port, const std::string& method, const std::string& path, const std::string& body) {
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

}  // namespace mx::server

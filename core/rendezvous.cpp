#include "core/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "core/error.h"

namespace mx {
namespace {

constexpr uint32_t kMagic = 0x6d787276;  // "mxrv": a stray connection is not taken for a node
constexpr size_t kMaxBlob = 1 << 16;

using Clock = std::chrono::steady_clock;

double seconds_left(Clock::time_point end) {
  return std::chrono::duration<double>(end - Clock::now()).count();
}

// Waits until fd is readable (or writable), at most until `end`; false on timeout.
bool wait_fd(int fd, short events, Clock::time_point end) {
  for (;;) {
    const double left = seconds_left(end);
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, int(std::min(left, 60.0) * 1000) + 1);  // no deadline: a minute at a time
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

bool read_all(int fd, void* buf, size_t n, Clock::time_point end) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, end)) return false;
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= size_t(r);
  }
  return true;
}

bool write_all(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    const ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
    if (r <= 0) return false;
    p += r;
    n -= size_t(r);
  }
  return true;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

constexpr size_t kMaxMessage = size_t(1) << 30;

}  // namespace

NodeLink::NodeLink(int fd) : fd_(fd) {
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // a step is one small message: no Nagle delay
}

NodeLink::~NodeLink() {
  if (fd_ >= 0) ::close(fd_);
}

void NodeLink::send(const std::string& msg) {
  const uint32_t n = htonl(uint32_t(msg.size()));
  if (msg.size() > kMaxMessage || !write_all(fd_, &n, 4) || !write_all(fd_, msg.data(), msg.size()))
    fail("tensor parallelism: the connection to another node is gone ({})", std::strerror(errno));
}

bool NodeLink::recv(std::string& msg, double timeout_s) {
  const auto end = timeout_s < 0 ? Clock::time_point::max()
                                 : Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                      std::chrono::duration<double>(timeout_s));
  if (!wait_fd(fd_, POLLIN, end)) return false;
  uint32_t n = 0;
  if (!read_all(fd_, &n, 4, Clock::time_point::max())) fail("tensor parallelism: the other node closed the connection");
  n = ntohl(n);
  if (n > kMaxMessage) fail("tensor parallelism: a message of {} bytes from another node", n);
  msg.resize(n);
  if (!read_all(fd_, msg.data(), n, Clock::time_point::max()))
    fail("tensor parallelism: the other node closed the connection");
  return true;
}

bool NodeLink::closed() const {
  char c;
  const ssize_t r = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

RendezvousServer::RendezvousServer(int port) {
  fd_ = ::socket(AF_INET6, SOCK_STREAM, 0);
  const bool v6 = fd_ >= 0;
  if (!v6) fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd_ < 0) fail("--master-port {}: cannot create a socket: {}", port, std::strerror(errno));
  const int one = 1, zero = 0;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int r;
  if (v6) {
    ::setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // IPv4 clients too
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(uint16_t(port));
    r = ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(uint16_t(port));
    r = ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  }
  if (r != 0 || ::listen(fd_, 64) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    fail("--master-port {}: cannot listen: {}", port, why);
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

RendezvousServer::~RendezvousServer() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<std::unique_ptr<NodeLink>> RendezvousServer::serve(int nnodes, const std::string& blob, double timeout_s) {
  if (blob.size() > kMaxBlob) fail("rendezvous: blob of {} bytes is too large", blob.size());
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::vector<bool> seen(size_t(nnodes), false);
  std::vector<std::unique_ptr<NodeLink>> links(static_cast<size_t>(nnodes));
  for (int got = 1; got < nnodes;) {
    if (!wait_fd(fd_, POLLIN, end)) {
      std::string missing;
      for (int n = 1; n < nnodes; ++n)
        if (!seen[size_t(n)]) missing += (missing.empty() ? "" : ", ") + std::to_string(n);
      fail("--master-port {}: node(s) {} did not connect within {:.0f} s", port_, missing, timeout_s);
    }
    Fd c{::accept(fd_, nullptr, nullptr)};
    if (c.fd < 0) continue;
    uint32_t hello[2];
    if (!read_all(c.fd, hello, sizeof(hello), end) || ntohl(hello[0]) != kMagic) continue;  // not one of ours
    const int rank = int(ntohl(hello[1]));
    if (rank < 1 || rank >= nnodes) fail("rendezvous: a node connected as --node-rank {} (--nnodes {})", rank, nnodes);
    if (seen[size_t(rank)]) fail("rendezvous: two nodes connected as --node-rank {}", rank);
    const uint32_t n = htonl(uint32_t(blob.size()));
    if (!write_all(c.fd, &n, 4) || !write_all(c.fd, blob.data(), blob.size())) continue;  // it retries
    seen[size_t(rank)] = true;
    links[size_t(rank)] = std::make_unique<NodeLink>(c.release());
    ++got;
  }
  return links;
}

std::string rendezvous_fetch(const std::string& addr, int port, int node_rank, double timeout_s) {
  return rendezvous_connect(addr, port, node_rank, timeout_s).blob;
}

Rendezvous rendezvous_connect(const std::string& addr, int port, int node_rank, double timeout_s) {
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string last = "no answer";
  while (seconds_left(end) > 0) {
    addrinfo* res = nullptr;
    const int g = ::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (g != 0) fail("--master-addr {}: {}", addr, gai_strerror(g));
    for (addrinfo* a = res; a; a = a->ai_next) {
      Fd s{::socket(a->ai_family, a->ai_socktype, a->ai_protocol)};
      if (s.fd < 0 || ::connect(s.fd, a->ai_addr, a->ai_addrlen) != 0) {
        last = std::strerror(errno);
        continue;
      }
      const uint32_t hello[2] = {htonl(kMagic), htonl(uint32_t(node_rank))};
      uint32_t n = 0;
      if (!write_all(s.fd, hello, sizeof(hello)) || !read_all(s.fd, &n, 4, end)) {
        last = "connection closed";
        continue;
      }
      n = ntohl(n);
      if (n > kMaxBlob) fail("--master-addr {}:{}: not an mxserve rendezvous", addr, port);
      std::string blob(n, '\0');
      if (!read_all(s.fd, blob.data(), n, end)) {
        last = "connection closed";
        continue;
      }
      ::freeaddrinfo(res);
      return Rendezvous{std::move(blob), std::make_unique<NodeLink>(s.release())};
    }
    ::freeaddrinfo(res);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  fail("--master-addr {} --master-port {}: node 0 did not answer within {:.0f} s ({})", addr, port, timeout_s, last);
}

}  // namespace mx

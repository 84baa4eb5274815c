// The multi-node rendezvous (core/rendezvous.h) on loopback.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/rendezvous.h"

namespace {
using namespace mx;

TEST(Rendezvous, EveryNodeGetsTheBlob) {
  RendezvousServer server(0);
  const std::string blob(128, '\x5a');
  std::vector<std::string> got(4);
  std::vector<std::thread> nodes;
  for (int n = 3; n >= 1; --n)  // any order
    nodes.emplace_back([&, n] { got[size_t(n)] = rendezvous_fetch("127.0.0.1", server.port(), n, 10); });
  server.serve(4, blob, 10);
  for (auto& t : nodes) t.join();
  for (int n = 1; n < 4; ++n) EXPECT_EQ(got[size_t(n)], blob);
}

TEST(Rendezvous, ANodeMayStartBeforeNodeZero) {
  // The fetch retries until the server listens; bind the port first to know it, serve later.
  RendezvousServer server(0);
  std::string got;
  std::thread node([&] { got = rendezvous_fetch("localhost", server.port(), 1, 10); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  server.serve(2, "id", 10);
  node.join();
  EXPECT_EQ(got, "id");
}

TEST(Rendezvous, MissingNodesFailWithOneLine) {
  RendezvousServer server(0);
  try {
    server.serve(3, "id", 0.3);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node(s) 1, 2 did not connect"), std::string::npos) << e.what();
  }
}

TEST(Rendezvous, NoServerFailsWithinTheTimeout) {
  int port = 0;
  {
    RendezvousServer s(0);  // a port nobody listens on once it closes
    port = s.port();
  }
  try {
    rendezvous_fetch("127.0.0.1", port, 1, 0.5);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not answer within"), std::string::npos) << e.what();
  }
}

TEST(Rendezvous, DuplicateNodeRankIsAnError) {
  RendezvousServer server(0);
  // The first of the two gets the blob, the second makes the server fail (and then times out itself).
  auto node = [&] {
    try {
      rendezvous_fetch("127.0.0.1", server.port(), 1, 1);
    } catch (const Error&) {
    }
  };
  std::thread a(node), b(node);
  EXPECT_THROW(server.serve(3, "id", 3), Error);
  a.join();
  b.join();
}

}  // namespace

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

// The connections stay open: node 0 sends steps, a node answers, and either side sees the other end.
TEST(Rendezvous, LinksCarryMessagesAndSeeTheOtherEndClose) {
  RendezvousServer server(0);
  Rendezvous node;
  std::thread t([&] { node = rendezvous_connect("127.0.0.1", server.port(), 1, 10); });
  auto links = server.serve(2, "id", 10);
  t.join();
  ASSERT_EQ(links.size(), 2u);
  ASSERT_TRUE(links[1] && node.link);
  EXPECT_EQ(node.blob, "id");
  const std::string big(300000, 'x');  // larger than a socket buffer
  std::thread sender([&] { links[1]->send(big); links[1]->send(""); });
  std::string got;
  ASSERT_TRUE(node.link->recv(got, 10));
  EXPECT_EQ(got, big);
  ASSERT_TRUE(node.link->recv(got, 10));
  EXPECT_EQ(got, "");
  sender.join();
  EXPECT_FALSE(node.link->recv(got, 0.05));  // nothing more: a timeout, not an error
  node.link->send("kv 123");
  ASSERT_TRUE(links[1]->recv(got, 10));
  EXPECT_EQ(got, "kv 123");
  EXPECT_FALSE(links[1]->closed());
  node.link.reset();  // the node's process ends
  for (int i = 0; i < 100 && !links[1]->closed(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(links[1]->closed());
  EXPECT_THROW(links[1]->recv(got, 1), Error);
}

}  // namespace

// The multi-node rendezvous of tensor parallelism (--master-addr, --master-port): node 0 hands a blob
// (NCCL's unique id) to every other node over TCP, so no file system or launcher is shared. A node that
// does not come within the timeout fails every side with one line, instead of NCCL's init waiting forever.
// The connection stays open as a NodeLink: node 0 sends each step to the other nodes over it, and a
// closed link tells either side that the other process has ended.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace mx {

// Length-prefixed messages over one TCP connection.
class NodeLink {
 public:
  explicit NodeLink(int fd);  // takes the socket
  ~NodeLink();
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;
  // Fails with one line when the other side is gone.
  void send(const std::string& msg);
  // Waits up to timeout_s (negative: no limit) for the next message: false on timeout; fails with one line
  // when the other side closed the connection.
  bool recv(std::string& msg, double timeout_s);
  // The other side closed the connection (looks without waiting or taking a message).
  bool closed() const;

 private:
  int fd_ = -1;
};

// Node 0's side: listens on `port` (0: any free port, see port()) of every interface.
class RendezvousServer {
 public:
  explicit RendezvousServer(int port);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;
  int port() const { return port_; }
  // Waits for nodes 1 .. nnodes - 1 (each once, in any order) and sends each the blob; fails when one is
  // missing after timeout_s, or a connection names a node rank out of range or twice. Returns the links,
  // indexed by node rank (entry 0 empty).
  std::vector<std::unique_ptr<NodeLink>> serve(int nnodes, const std::string& blob, double timeout_s);

 private:
  int fd_ = -1, port_ = 0;
};

// Node `node_rank`'s side (>= 1): connects to addr:port, retrying until timeout_s (node 0 may start
// later), and returns node 0's blob.
std::string rendezvous_fetch(const std::string& addr, int port, int node_rank, double timeout_s);
// The same, keeping the connection to node 0.
struct Rendezvous {
  std::string blob;
  std::unique_ptr<NodeLink> link;
};
Rendezvous rendezvous_connect(const std::string& addr, int port, int node_rank, double timeout_s);

}  // namespace mx

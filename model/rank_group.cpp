#include "model/rank_group.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/log.h"

namespace mx {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

// The other ranks' kernels wait on the failed one's collectives and cannot be stopped from here.
void RankGroup::fatal(const std::string& why) const {
  log::error("tensor parallelism: {}; exiting", why);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

RankGroup::RankGroup(const RankGroupOptions& o, std::string secret, MakeRank make, EndRank end,
                     std::function<void()> abandon)
    : o_(o), local_(o.tp.ranks_per_node()), first_(o.tp.first_rank()), secret_(std::move(secret)),
      make_(std::move(make)), end_(std::move(end)), abandon_(std::move(abandon)), runners_(size_t(local_)),
      rank_out_(size_t(local_)), errors_(size_t(local_)) {
  if (o.tp.nnodes > 1) meet();
  for (int r = 0; r < local_; ++r) threads_.emplace_back([this, r] { rank_main(r); });
  {
    std::unique_lock lk(mu_);
    done_.wait(lk, [&] { return ready_ == local_; });
  }
  for (int r = 0; r < local_; ++r)
    if (!errors_[size_t(r)].empty()) {
      const std::string why = fmt::format("tensor parallelism: rank {}: {}", first_ + r, errors_[size_t(r)]);
      shutdown();
      throw Error(why);
    }
  // Every node's KV pool takes the same block ids: node 0 learns the fewest any node holds.
  int blocks = runners_[0]->kv_shape().num_blocks;
  for (const auto& r : runners_) blocks = std::min(blocks, r->kv_shape().num_blocks);
  if (to_node0_) to_node0_->send("kv " + std::to_string(blocks));
  for (size_t n = 1; n < links_.size(); ++n) {
    std::string msg;
    try {
      links_[n]->recv(msg, -1);
    } catch (const Error&) {
      shutdown();
      fail("tensor parallelism: node {} ended while loading the model (its log says why)", n);
    }
    if (msg.rfind("kv ", 0) != 0) {
      shutdown();
      fail("tensor parallelism: node {} sent '{}' instead of its KV blocks", n, msg.substr(0, 40));
    }
    remote_blocks_ = std::min(remote_blocks_, std::atoi(msg.c_str() + 3));
  }
  if (links_.size() > 1) watcher_ = std::thread([this] { watch_nodes(); });
}

// Node 0 listens on --master-port and hands its secret and flags to the other nodes, which check theirs.
void RankGroup::meet() {
  const TensorParallel& tp = o_.tp;
  if (tp.node_rank == 0) {
    RendezvousServer server(tp.master_port);
    log::info("tensor parallel: waiting on port {} for {} other node(s)", server.port(), tp.nnodes - 1);
    const uint32_t n = uint32_t(secret_.size());
    std::string blob(reinterpret_cast<const char*>(&n), 4);
    links_ = server.serve(tp.nnodes, blob + secret_ + o_.agreed, o_.meet_timeout_s);
    return;
  }
  Rendezvous r = rendezvous_connect(tp.master_addr, tp.master_port, tp.node_rank, o_.meet_timeout_s);
  uint32_t n = 0;
  if (r.blob.size() >= 4) std::memcpy(&n, r.blob.data(), 4);
  if (r.blob.size() < 4 || r.blob.size() - 4 < n) fail("--master-addr {}: not an mxserve node 0", tp.master_addr);
  const std::string theirs = r.blob.substr(4 + n);
  if (theirs != o_.agreed)
    fail("--node-rank {}: this node's flags differ from node 0's (node 0: {}; here: {})", tp.node_rank, theirs,
         o_.agreed);
  secret_ = r.blob.substr(4, n);
  to_node0_ = std::move(r.link);
}

RankGroup::~RankGroup() {
  {  // first the watcher: the other nodes leave once they read "quit"
    std::lock_guard lk(mu_);
    unwatch_ = true;
  }
  done_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  for (size_t n = 1; n < links_.size(); ++n) {
    try {
      links_[n]->send("quit");
    } catch (const Error&) {
    }
  }
  shutdown();
}

void RankGroup::shutdown() {
  {
    std::lock_guard lk(mu_);
    if (stop_) return;
    stop_ = true;
  }
  go_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void RankGroup::rank_main(int r) {
  try {
    runners_[size_t(r)] = make_(r, secret_);
  } catch (const std::exception& e) {
    errors_[size_t(r)] = e.what();
    if (abandon_) abandon_();
  }
  std::unique_lock lk(mu_);
  ++ready_;
  done_.notify_all();
  unsigned long long seen = 0;
  for (;;) {
    go_.wait(lk, [&] { return stop_ || gen_ != seen; });
    if (stop_) break;
    seen = gen_;
    const std::span<const SeqStep> seqs = seqs_;
    const std::span<SampleResult> out = r == 0 ? out_ : std::span<SampleResult>(rank_out_[size_t(r)]);
    lk.unlock();
    std::string err;
    try {
      if (!runners_[size_t(r)]) fail("rank {} was not set up", first_ + r);
      runners_[size_t(r)]->step(seqs, out);
    } catch (const std::exception& e) {
      err = e.what();
    }
    lk.lock();
    errors_[size_t(r)] = err;
    ++finished_;
    done_.notify_all();
  }
  lk.unlock();
  runners_[size_t(r)].reset();  // on the rank's own thread (its device)
  if (end_) end_(r);
}

void RankGroup::step(std::span<const SeqStep> seqs, std::span<SampleResult> out) {
  if (to_node0_) fail("tensor parallelism: steps come from node 0 on node {}", o_.tp.node_rank);
  if (links_.size() > 1) {
    encode_step(seqs, out.size(), wire_);
    for (size_t n = 1; n < links_.size(); ++n) {
      try {
        links_[n]->send(wire_);
      } catch (const Error&) {
        fatal(fmt::format("node {} has ended (its log says why)", n));
      }
    }
  }
  run_local(seqs, out);
}

void RankGroup::run_remote_steps() {
  if (!to_node0_) fail("tensor parallelism: only a node other than 0 runs node 0's steps");
  WireStep w;
  std::vector<SampleResult> out;
  std::string msg;
  for (;;) {
    try {
      to_node0_->recv(msg, -1);
    } catch (const Error&) {
      fatal("node 0 has ended without saying so (its log says why)");
    }
    if (msg == "quit") return;
    decode_step(msg, w);
    out.resize(w.num_results);
    try {
      run_local(w.seqs, out);
    } catch (const Error& e) {  // refused alike on every rank, node 0 too: it goes on, so do we
      log::warn("tensor parallel: a step refused: {}", e.what());
    }
  }
}

// This node's ranks run the step; waits for them, watching the other nodes' connections.
void RankGroup::run_local(std::span<const SeqStep> seqs, std::span<SampleResult> out) {
  std::unique_lock lk(mu_);
  seqs_ = seqs;
  out_ = out;
  for (int r = 1; r < local_; ++r) rank_out_[size_t(r)].resize(out.size());
  finished_ = 0;
  ++gen_;
  go_.notify_all();
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.step_timeout_s));
  const bool remote = links_.size() > 1 || to_node0_;
  for (;;) {
    const auto until = remote ? std::min(deadline, Clock::now() + std::chrono::milliseconds(100)) : deadline;
    if (done_.wait_until(lk, until, [&] { return finished_ == local_; })) break;
    if (Clock::now() >= deadline)
      fatal(fmt::format("{} of this node's {} ranks did not finish a step within {:.0f} s: a GPU or a rank hangs",
                        local_ - finished_, local_, o_.step_timeout_s));
    for (size_t n = 1; n < links_.size(); ++n)
      if (links_[n]->closed()) fatal(fmt::format("node {} ended during a step (its log says why)", n));
    if (to_node0_ && to_node0_->closed()) fatal("node 0 ended during a step (its log says why)");
  }
  int failed = 0;
  for (const auto& e : errors_) failed += !e.empty();
  if (failed == 0) return;
  // Every rank refused the step alike (its input) before any collective: nothing waits, go on.
  bool same = failed == local_;
  for (const auto& e : errors_) same = same && e == errors_[0];
  if (same) throw Error(errors_[0]);
  for (int r = 0; r < local_; ++r)
    if (!errors_[size_t(r)].empty())
      fatal(fmt::format("rank {} failed a step: {}; the other ranks cannot go on", first_ + r, errors_[size_t(r)]));
  fatal("a rank failed");
}

// Between steps nothing else would notice: a server idle when another node ends must not wait for the
// next request to say so.
void RankGroup::watch_nodes() {
  std::unique_lock lk(mu_);
  while (!done_.wait_for(lk, std::chrono::milliseconds(200), [&] { return unwatch_; })) {
    for (size_t n = 1; n < links_.size(); ++n)
      if (links_[n]->closed()) fatal(fmt::format("node {} has ended (its log says why)", n));
  }
}

int RankGroup::kv_blocks() const {
  int k = remote_blocks_;
  for (const auto& r : runners_) k = std::min(k, r->kv_shape().num_blocks);
  return k;
}

}  // namespace mx

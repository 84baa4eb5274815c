// The tensor-parallel group's orchestration (model/rank_group.h) with stand-in runners: every rank runs
// every step, failures end in one line (the process exits where ranks would wait for good), and two nodes
// in one process meet over loopback and run node 0's steps.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/rendezvous.h"
#include "model/rank_group.h"

namespace {
using namespace mx;

// What the stand-in ranks of one group saw: per local rank, the steps as (seq_id, tokens) lists.
struct Seen {
  std::mutex mu;
  std::vector<std::vector<std::vector<int32_t>>> steps;  // [rank][step] = seq ids then tokens
};

struct FakeRank final : ModelRunner {
  ModelConfig cfg;
  int rank = 0, local = 0, blocks = 100, fail_at = -1, hang_at = -1;
  bool fail_alike = false;
  Seen* seen = nullptr;
  int n = 0;
  const ModelConfig& config() const override { return cfg; }
  KvCacheShape kv_shape() const override { return {16, blocks, 0}; }
  void step(std::span<const SeqStep> seqs, std::span<SampleResult> out) override {
    const int k = n++;
    if (k == hang_at) std::this_thread::sleep_for(std::chrono::seconds(30));
    if (k == fail_at) throw Error(fail_alike ? "bad input" : "rank " + std::to_string(rank) + " broke");
    std::vector<int32_t> rec;
    for (const SeqStep& s : seqs) {
      rec.push_back(int32_t(s.seq_id));
      rec.insert(rec.end(), s.tokens.begin(), s.tokens.end());
    }
    {
      std::lock_guard lk(seen->mu);
      seen->steps[size_t(local)].push_back(rec);
    }
    for (size_t i = 0; i < seqs.size(); ++i)
      if (seqs[i].sample) out[i].token = 1000 * rank + seqs[i].tokens.back();
  }
};

RankGroupOptions options(int size, int nnodes = 1, int node_rank = 0, int port = 0) {
  RankGroupOptions o;
  o.tp.size = size;
  o.tp.nnodes = nnodes;
  o.tp.node_rank = node_rank;
  o.tp.master_port = port;
  o.agreed = "flags";
  o.step_timeout_s = 20;
  o.meet_timeout_s = 20;
  return o;
}

// A group of stand-in ranks; `tune` adjusts rank r before it is handed over.
std::unique_ptr<RankGroup> make_group(const RankGroupOptions& o, Seen& seen, std::function<void(FakeRank&)> tune = {},
                                      std::string* secret_seen = nullptr) {
  seen.steps.assign(size_t(o.tp.ranks_per_node()), {});
  return std::make_unique<RankGroup>(o, "s3cret", [&seen, tune, secret_seen, o](int r, const std::string& secret) {
    auto f = std::make_unique<FakeRank>();
    f->rank = o.tp.first_rank() + r;
    f->local = r;
    f->seen = &seen;
    if (secret_seen && r == 0) *secret_seen = secret;
    if (tune) tune(*f);
    return std::unique_ptr<ModelRunner>(std::move(f));
  });
}

// A step of two sequences, the second sampled.
struct TwoSeqs {
  std::vector<int32_t> a{1, 2, 3}, b{7};
  std::vector<SeqStep> seqs = std::vector<SeqStep>(2);
  std::vector<SampleResult> out = std::vector<SampleResult>(2);
  TwoSeqs() {
    seqs[0].seq_id = 4;
    seqs[0].tokens = a;
    seqs[1].seq_id = 9;
    seqs[1].tokens = b;
    seqs[1].sample = true;
  }
};

int free_port() {
  RendezvousServer s(0);
  return s.port();
}

TEST(RankGroup, EveryRankRunsEveryStep) {
  Seen seen;
  auto g = make_group(options(4), seen);
  TwoSeqs t;
  for (int i = 0; i < 3; ++i) {
    t.b[0] = 7 + i;
    g->step(t.seqs, t.out);
    EXPECT_EQ(t.out[1].token, 7 + i);  // rank 0's result
  }
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(seen.steps[size_t(r)].size(), 3u) << r;
    EXPECT_EQ(seen.steps[size_t(r)][2], (std::vector<int32_t>{4, 1, 2, 3, 9, 9}));
  }
  EXPECT_EQ(g->kv_blocks(), 100);
}

TEST(RankGroup, AStepEveryRankRefusesIsAnOrdinaryError) {
  Seen seen;
  auto g = make_group(options(2), seen, [](FakeRank& f) { f.fail_at = 1, f.fail_alike = true; });
  TwoSeqs t;
  g->step(t.seqs, t.out);
  EXPECT_THROW(g->step(t.seqs, t.out), Error);
  g->step(t.seqs, t.out);  // and the group goes on
  EXPECT_EQ(seen.steps[1].size(), 2u);
}

TEST(RankGroup, ASetUpThatFailsNamesTheRank) {
  Seen seen;
  std::atomic<int> abandoned{0};
  try {
    RankGroup g(options(4), "", [](int r, const std::string&) -> std::unique_ptr<ModelRunner> {
      if (r == 2) throw Error("out of memory");
      return std::make_unique<FakeRank>();
    }, {}, [&] { ++abandoned; });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2: out of memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(abandoned.load(), 1);
}

TEST(RankGroupDeathTest, ARankFailingAloneEndsTheProcessWithOneLine) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Seen seen;
        auto g = make_group(options(2), seen, [](FakeRank& f) { f.fail_at = f.rank == 1 ? 0 : -1; });
        TwoSeqs t;
        g->step(t.seqs, t.out);
      },
      testing::ExitedWithCode(1), "rank 1 failed a step: rank 1 broke");
}

TEST(RankGroupDeathTest, AHungRankEndsTheProcessAfterTheTimeout) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Seen seen;
        RankGroupOptions o = options(2);
        o.step_timeout_s = 0.3;
        auto g = make_group(o, seen, [](FakeRank& f) { f.hang_at = f.rank == 0 ? 0 : -1; });
        TwoSeqs t;
        g->step(t.seqs, t.out);
      },
      testing::ExitedWithCode(1), "did not finish a step within");
}

TEST(RankGroup, TwoNodesRunNodeZerosSteps) {
  const int port = free_port();
  Seen s0, s1;
  std::unique_ptr<RankGroup> g0, g1;
  std::string secret1;
  std::thread t1([&] {
    g1 = make_group(options(4, 2, 1, port), s1, [](FakeRank& f) { f.blocks = 60; }, &secret1);
    g1->run_remote_steps();  // until node 0 says quit
  });
  g0 = make_group(options(4, 2, 0, port), s0);
  EXPECT_EQ(g0->first_rank(), 0);
  EXPECT_EQ(g0->kv_blocks(), 60);  // the fewest of any node
  TwoSeqs t;
  for (int i = 0; i < 3; ++i) {
    t.a.push_back(i);
    t.seqs[0].tokens = t.a;
    g0->step(t.seqs, t.out);
  }
  g0.reset();  // sends quit
  t1.join();
  EXPECT_EQ(secret1, "s3cret");
  EXPECT_EQ(g1->first_rank(), 2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(s1.steps[size_t(r)].size(), 3u);
    EXPECT_EQ(s1.steps[size_t(r)], s0.steps[0]) << "node 1 rank " << r;
  }
  g1.reset();
}

TEST(RankGroup, ANodeWithOtherFlagsIsRefused) {
  const int port = free_port();
  Seen s0, s1;
  std::string err0, err1;
  std::thread t1([&] {
    RankGroupOptions o = options(2, 2, 1, port);
    o.agreed = "other flags";
    try {
      make_group(o, s1);
    } catch (const Error& e) {
      err1 = e.what();
    }
  });
  try {
    make_group(options(2, 2, 0, port), s0);
  } catch (const Error& e) {
    err0 = e.what();
  }
  t1.join();
  EXPECT_NE(err1.find("flags differ from node 0's"), std::string::npos) << err1;
  EXPECT_NE(err0.find("node 1 ended while loading"), std::string::npos) << err0;
}

void node_one_ends() {
  const int port = free_port();
  Seen s0;
  Seen s1;
  std::unique_ptr<RankGroup> g1;
  std::thread t1([&] { g1 = make_group(options(2, 2, 1, port), s1); });
  auto g0 = make_group(options(2, 2, 0, port), s0);
  t1.join();
  g1.reset();  // node 1's process ends without a word; node 0 is idle
  std::this_thread::sleep_for(std::chrono::seconds(5));
}

TEST(RankGroupDeathTest, ANodeThatEndsEndsNodeZeroWithOneLine) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(node_one_ends(), testing::ExitedWithCode(1), "node 1 has ended");
}

}  // namespace

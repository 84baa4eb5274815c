// The engine's host time a decode step at many streams, with a runner that does no work: what the
// scheduler and the delivery of each step's tokens cost between two GPU steps. With readers on, a thread
// a request waits on its channel as the server's HTTP threads do.
// Usage: build/bench/engine_host_bench [STREAMS=512] [READERS=1]   (results: docs/perf.md, session 29)
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/engine.h"

using namespace mx;
using namespace mx::runtime;

namespace {

struct NullRunner : ModelRunner {
  ModelConfig cfg;
  KvCacheShape shape{16, 80000, 128};
  NullRunner() { cfg.max_position_embeddings = 8192; }
  const ModelConfig& config() const override { return cfg; }
  KvCacheShape kv_shape() const override { return shape; }
  void step(std::span<const SeqStep> seqs, std::span<SampleResult> out) override {
    for (size_t i = 0; i < seqs.size(); ++i)
      if (seqs[i].sample) out[i].token = 1000 + (seqs[i].tokens.back() + 7) % 1000;  // never an eos id
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 512;
  const bool readers = argc > 2 ? std::atoi(argv[2]) != 0 : true;
  NullRunner r;
  EngineOptions o;
  o.max_num_seqs = n;
  o.max_num_batched_tokens = 8192;
  o.max_waiting = n;
  o.max_prefill_tokens_with_decodes = 0;
  Engine e(r, o);
  std::vector<std::shared_ptr<Channel>> chs;
  for (int i = 0; i < n; ++i) {  // 1,024-token prompts, 1,024 tokens out (the load benchmark's shape)
    GenRequest g;
    g.prompt.resize(1024);
    for (int j = 0; j < 1024; ++j) g.prompt[size_t(j)] = (i * 131 + j * 7) % 100000;
    g.max_tokens = 1024;
    chs.push_back(std::make_shared<Channel>());
    if (!e.submit(g, chs.back())) {
      std::fprintf(stderr, "submit %d refused\n", i);
      return 1;
    }
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  if (readers)
    for (auto& c : chs) threads.emplace_back([&stop, c] { while (!stop) c->pop(std::chrono::milliseconds(100)); });
  const int warm = 200, timed = 500;  // the prompts are prefilled within the warm-up steps
  double ms = 0;
  for (int s = 0; s < warm + timed; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!e.step()) break;
    if (s >= warm) ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!readers)
      for (auto& c : chs) c->pop(std::chrono::milliseconds(0));
  }
  stop = true;
  for (auto& t : threads) t.join();
  std::printf("%d streams, readers %s: %.3f ms a decode step (mean of %d)\n", n, readers ? "on" : "off", ms / timed,
              timed);
  return 0;
}

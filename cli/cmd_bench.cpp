// `mxserve bench`: llama-bench style prefill (ppN) and decode (tgN) throughput at a KV depth.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "cli/device.h"
#ifdef MXSERVE_HAVE_CUDA
#include "cli/bench_hooks.h"
#include "kernels/engine/cuda_runner.h"
#include "kernels/engine/device_model.h"
#endif

namespace mx::cli {
namespace {

struct BenchOptions {
  std::string preset, model, step_trace;
  std::vector<int> pp{512}, tg{128}, batch{1};
  int depth = 0, reps = 5;
  int prefill_min_tokens = -1;  // -1: the engine's default
  int decode_step_min_tokens = -1;  // -1: the engine's default
  int spec_tokens = 0;               // > 0: also time decode steps checking this many drafts a row
  bool no_decode_ahead = false;      // !CudaEngineOptions::decode_ahead
  bool clone_rows = false;  // decode rows share row 0's prompt and first token (an optimistic figure)
  bool json = false, breakdown = false, no_graphs = false;
  float gpu_mem = 0.9f;
  FormatFlags formats;  // --kv-cache-dtype, --mxfp4-layers, --fp8-layers
  TensorParallel tp;    // --tensor-parallel-size, ...
};

struct Stat { double mean = 0, sd = 0; };
Stat stat(const std::vector<double>& v) {
  Stat s;
  for (double x : v) s.mean += x;
  s.mean /= v.size();
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / (v.size() - 1)) : 0;
  return s;
}
// tokens / second over `reps` timed calls of run (the caller warms up first).
template <class F>
std::vector<double> timed_rates(int reps, double tokens, F&& run) {
  std::vector<double> v;
  for (int rep = 0; rep < reps; ++rep) {
    auto a = std::chrono::steady_clock::now();
    run();
    v.push_back(tokens / std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  return v;
}

#ifdef MXSERVE_HAVE_CUDA
// One sequence's step of `toks` at `depth`, greedy, sampled (the diagnostics below).
SeqStep greedy_step(std::span<const int32_t> toks, int depth, const KvTables& bt) {
  SeqStep s;
  s.tokens = toks;
  s.start_pos = depth;
  s.block_table = bt.full;
  s.sliding_table = bt.sliding;
  s.sample = true;
  s.sampling.temperature = 0;
  return s;
}

// One step, run eagerly with an event after every kernel: time, bytes and achieved bandwidth per kernel
// kind (all layers summed). Event gaps include launch gaps, so the total is slower than a graph
// replay; the table says where the time goes, not the speed. Expert bytes count the experts routed.
void print_breakdown(CudaRunnerBase& r, CudaBenchHooks& hooks, std::span<const SeqStep> steps, const std::string& what,
                     double copy_gbps) {
  std::vector<SampleResult> res(steps.size());
  hooks.set_profiling(true);
  r.step(steps, res);  // warm-up
  r.step(steps, res);
  hooks.set_profiling(false);
  auto prof = hooks.last_profile();
  std::sort(prof.begin(), prof.end(), [](const KernelProfile& a, const KernelProfile& b) { return a.ms > b.ms; });
  double total = 0, bytes = 0;
  for (const auto& k : prof) { total += k.ms; bytes += k.bytes; }
  const std::vector<int> routed = hooks.last_routed_experts();
  double mean_routed = 0;
  for (int e : routed) mean_routed += double(e) / routed.size();
  std::printf("\nper-kernel breakdown, %s (eager, events between kernels)", what.c_str());
  if (!routed.empty()) std::printf(", %.1f of %d experts routed a layer", mean_routed, r.config().num_experts);
  std::printf(":\n| kernel | calls | ms | %% of step | MB | GB/s | %% copy BW |\n|---|---|---|---|---|---|---|\n");
  for (const auto& k : prof)
    std::printf("| %s | %d | %.3f | %.1f | %.1f | %.0f | %.0f |\n", k.name.c_str(), k.calls, k.ms, 100 * k.ms / total,
                k.bytes / 1e6, k.bytes / (k.ms * 1e-3) / 1e9, 100 * k.bytes / (k.ms * 1e-3) / 1e9 / copy_gbps);
  std::printf("| total | | %.3f | 100 | %.1f | %.0f | %.0f |\n", total, bytes / 1e6, bytes / (total * 1e-3) / 1e9,
              100 * bytes / (total * 1e-3) / 1e9 / copy_gbps);
}

void print_breakdown(CudaRunnerBase& r, CudaBenchHooks& hooks, const KvTables& bt, int depth, double copy_gbps, int n) {
  const std::vector<int32_t> toks(n, 1);
  const SeqStep s = greedy_step(toks, depth, bt);
  print_breakdown(r, hooks, std::span<const SeqStep>(&s, 1),
                  "one " + std::to_string(n) + "-token step of one sequence at depth " + std::to_string(depth),
                  copy_gbps);
}

// Mean ms of a step replayed `steps` times after 5 warm-ups (decode graphs capture on the first, wide graphs
// on the second, behind it), with the kernel kinds of `skip` left out.
double step_ms_skipping(CudaBenchHooks& hooks, uint32_t skip, int steps, const std::function<void()>& run) {
  hooks.set_skip(skip);
  for (int i = 0; i < 5; ++i) run();
  const auto a = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) run();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count() / steps;
}

// The table of marginal costs: the step with each kind (bit0 + its index) left out in turn.
void print_marginal_table(CudaBenchHooks& hooks, std::span<const char* const> names, int bit0, double full, int steps,
                          const std::function<void()>& run) {
  std::printf("| kernel kind (all layers) | step without it, ms | marginal ms | %% of step |\n|---|---|---|---|\n");
  for (int b = 0; b < int(names.size()); ++b) {
    const double t = step_ms_skipping(hooks, 1u << (bit0 + b), steps, run);
    std::printf("| %s | %.3f | %.3f | %.1f |\n", names[size_t(b)], t, full - t, 100 * (full - t) / full);
  }
  hooks.set_skip(0);
}

// Graph replays of batch-1 decode steps with one kernel kind left out: the drop in step time is that
// kind's marginal cost in the real schedule (graph + programmatic dependent launch), which the eager
// table above, with an event after every kernel, cannot show.
void print_graph_marginals(CudaRunnerBase& r, CudaBenchHooks& hooks, const KvTables& bt, int depth) {
  const int32_t tok = 1;
  const SeqStep s = greedy_step(std::span<const int32_t>(&tok, 1), depth, bt);
  SampleResult res;
  auto run = [&] { r.step(std::span<const SeqStep>(&s, 1), std::span<SampleResult>(&res, 1)); };
  constexpr int kSteps = 100;
  const double full = step_ms_skipping(hooks, 0, kSteps, run);
  std::printf("\ngraph-mode marginal cost per kernel kind, batch-1 decode step at depth %d: full step %.3f ms\n",
              depth, full);
  const double gpu = hooks.replay_decode_graph_ms(1, 100);
  std::printf("the step's graph replayed back to back: %.3f ms a step, so the host's turn between steps costs %.1f us\n",
              gpu, 1e3 * (full - gpu));
  print_marginal_table(hooks, kDecodeKernelNames, 0, full, kSteps, run);
}

// The same for a wide decode step of distinct rows (the prefill forward, replayed as a wide graph): what
// each kernel kind costs in the schedule a load runs.
void print_wide_graph_marginals(CudaRunnerBase& r, CudaBenchHooks& hooks, std::span<const SeqStep> steps) {
  std::vector<SampleResult> res(steps.size());
  auto run = [&] { r.step(steps, res); };
  constexpr int kSteps = 20;
  const double full = step_ms_skipping(hooks, 0, kSteps, run);
  std::printf("\ngraph-mode marginal cost per kernel kind, wide decode step of %zu distinct rows: full step %.3f ms\n",
              steps.size(), full);
  print_marginal_table(hooks, kWideKernelNames, kWideKernelBit0, full, kSteps, run);
}

// Per phase of the six launches per layer, averaged over layers (attention split by window): how long
// after the previous kernel's last CTA exits the CTAs pass their wait, the last CTA's exit after that,
// and the phase's share of the layer (last exit - previous last exit). Records: 4 words (cta_trace.h).
void summarize_op_trace(const std::vector<uint64_t>& t, int layers, bool tp) {
  constexpr int kPhases = 6;
  struct Agg { uint64_t first = ~0ull, wait_lo = ~0ull, wait_hi = 0, last = 0; std::vector<uint64_t> waits; };
  std::vector<Agg> a(size_t(layers) * kPhases);
  for (size_t i = 0; i + 3 < t.size(); i += 4) {
    const int layer = int(t[i + 3] >> 16), ph = int((t[i + 3] >> 8) & 0xff);
    if (layer >= layers || ph >= kPhases) continue;
    Agg& g = a[size_t(layer) * kPhases + ph];
    g.first = std::min(g.first, t[i]);
    g.last = std::max(g.last, t[i + 2]);
    if (t[i + 1]) g.waits.push_back(t[i + 1]);
  }
  const char* names[kPhases + 1] = {"qkv", "attention (even layers)", "o-proj", "router", "FC1", "FC2",
                                    "attention (odd layers)"};
  double release[kPhases + 1] = {}, work[kPhases + 1] = {}, span[kPhases + 1] = {}, early[kPhases + 1] = {};
  int n[kPhases + 1] = {};
  uint64_t prev_last = 0;
  for (int l = 0; l < layers; ++l)
    for (int ph = 0; ph < kPhases; ++ph) {
      Agg& g = a[size_t(l) * kPhases + ph];
      if (g.waits.empty() || g.last == 0) continue;  // not launched (the router inside the o-proj)
      std::sort(g.waits.begin(), g.waits.end());
      const uint64_t med = g.waits[g.waits.size() / 2];
      if (prev_last) {
        const int k = ph == 1 && (l & 1) ? kPhases : ph;
        release[k] += double(med) - double(prev_last);
        work[k] += double(g.last) - double(med);
        span[k] += double(g.last) - double(prev_last);
        early[k] += double(prev_last) - double(g.first);
        ++n[k];
      }
      prev_last = g.last;
    }
  std::fprintf(stderr, "per-op step trace, us per layer (averages): phase: wait released after the previous "
                       "kernel's last exit | last exit after release | phase span | first CTA entered before\n");
  double total = 0;
  for (int k = 0; k <= kPhases; ++k) {
    if (!n[k]) continue;
    std::fprintf(stderr, "  %-24s %6.2f %6.2f %6.2f %6.2f  (%d layers)\n", names[k], release[k] / n[k] / 1e3,
                 work[k] / n[k] / 1e3, span[k] / n[k] / 1e3, early[k] / n[k] / 1e3, n[k]);
    total += span[k] / n[k] * (k == 1 || k == kPhases ? 0.5 : 1.0);
  }
  std::fprintf(stderr, "  layer: %.2f us\n", total / 1e3);
  if (tp)
    std::fprintf(stderr, "  (tensor parallel: the sums over ranks run before the router and qkv, in their release)\n");
}

// The decode step's timeline of one batch-1 step at the given depth, as CSV: per item (the
// persistent step) or per CTA (the six launches per layer; cta_trace.h) the layer, phase (0 qkv,
// 1 attention, 2 o-proj, 3 router, 4 FC1, 5 FC2), sm, and the entry / wait satisfied (0: none) / exit
// times in ns from the step's first item.
void write_step_trace(CudaRunnerBase& r, CudaBenchHooks& hooks, const KvTables& bt, int depth,
                      const std::string& path, bool tp) {
  const int32_t tok = 1;
  const SeqStep s = greedy_step(std::span<const int32_t>(&tok, 1), depth, bt);
  SampleResult res;
  hooks.set_step_trace(true);
  for (int i = 0; i < 3; ++i) r.step(std::span<const SeqStep>(&s, 1), std::span<SampleResult>(&res, 1));
  const std::vector<uint64_t> t = hooks.last_step_trace();
  const int kind = hooks.last_step_trace_kind();
  hooks.set_step_trace(false);
  if (t.empty()) fail("--step-trace: the 1-token step left no trace");
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) fail("--step-trace: cannot write {}", path);
  uint64_t t0 = ~0ull;
  for (size_t i = 0; i < t.size(); i += 4)
    if (t[i]) t0 = std::min(t0, t[i]);
  std::fprintf(f, "layer,phase,sm,start,waited,end\n");
  for (size_t i = 0; i < t.size(); i += 4) {
    if (!t[i]) continue;  // not run (no such item in this step)
    std::fprintf(f, "%llu,%llu,%llu,%lld,%lld,%lld\n", (unsigned long long)(t[i + 3] >> 16),
                 (unsigned long long)((t[i + 3] >> 8) & 0xff), (unsigned long long)(t[i + 3] & 0xff),
                 (long long)(t[i] - t0), t[i + 1] ? (long long)(t[i + 1] - t0) : -1LL, (long long)(t[i + 2] - t0));
  }
  std::fclose(f);
  std::fprintf(stderr, "step trace: %zu items written to %s\n", t.size() / 4, path.c_str());
  if (kind == 2) summarize_op_trace(t, r.config().num_layers, tp);
}

void run_bench(const BenchOptions& o) {
  if (o.preset.empty() == o.model.empty()) fail("bench: give exactly one of --preset or --model");
  const int max_b = *std::max_element(o.batch.begin(), o.batch.end());
  const int max_pp = *std::max_element(o.pp.begin(), o.pp.end());
  const int max_tg = *std::max_element(o.tg.begin(), o.tg.end());
  CudaEngineOptions eo;
  eo.dummy_weights = !o.preset.empty();
  eo.preset = o.preset;
  eo.model_dir = o.model;
  eo.gpu_memory_utilization = o.gpu_mem;
  const Formats fmt = resolve_formats(o.formats);
  eo.kv_fp8 = fmt.kv_fp8;
  eo.dense = fmt.dense;
  eo.block_size = 16;
  const int tg_span = max_tg * (1 + o.spec_tokens);  // positions a row's decode test takes
  eo.max_model_len = o.depth + std::max(max_pp, tg_span) + 16;
  eo.max_num_seqs = max_b;
  eo.max_tokens_per_step = std::max({max_b * (1 + o.spec_tokens), 2048});
  if (o.prefill_min_tokens >= 0) eo.prefill_min_tokens = o.prefill_min_tokens;
  if (o.decode_step_min_tokens >= 0) eo.decode_step_min_tokens = o.decode_step_min_tokens;
  eo.decode_ahead = !o.no_decode_ahead;
  auto t0 = std::chrono::steady_clock::now();
  eo.use_graphs = !o.no_graphs;
  eo.tp = o.tp;
  // The breakdown and the step trace change every local rank's launches alike and read rank 0's; ranks on
  // another node would not follow.
  if (o.tp.nnodes > 1 && o.breakdown)
    fail("--breakdown under tensor parallelism needs every rank on this host (--nnodes 1)");
  if (o.tp.nnodes > 1 && !o.step_trace.empty())
    fail("--step-trace under tensor parallelism needs every rank on this host (--nnodes 1)");
  auto r = make_cuda_runner(eo);
  if (o.tp.node_rank > 0) {  // started with node 0's flags: its GPUs run node 0's steps
    run_remote_steps(*r);
    return;
  }
  CudaBenchHooks hooks(*r);
  const auto ls = r->load_stats();
  std::fprintf(stderr, "loaded in %.2f s (weights %.2f GB, upload %.2f GB/s), KV %.2f GB (%s, %lld tokens), dense %s, "
               "%d GPU%s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), ls.weight_bytes / 1e9,
               ls.upload_gbps, ls.kv_bytes / 1e9, eo.kv_fp8 ? "fp8 e4m3" : "bf16",
               (long long)r->kv_shape().num_blocks * r->kv_shape().block_size, eo.dense.describe().c_str(), eo.tp.size,
               eo.tp.size == 1 ? "" : "s (tensor parallel)");
  const double copy_gbps = measure_d2d_bandwidth_gbps(size_t(1) << 30);
  const int bs = eo.block_size, V = r->config().vocab_size;
  const int window = r->kv_shape().sliding_window;
  const int depth_blocks = (o.depth + bs - 1) / bs;
  const int seq_blocks = (eo.max_model_len + bs - 1) / bs;
  const int row_blocks = (o.depth + tg_span + 1 + bs - 1) / bs;
  // Decode rows other than row 0 fill their prompts in chunks of this size, so their sliding layers
  // need only a ring of blocks covering the window and one chunk.
  const int fill_chunk = std::min(512, eo.max_tokens_per_step);
  const int ring = std::min(row_blocks, (window + fill_chunk + bs - 1) / bs + 2);
  int next_block = 0;
  auto take = [&](int n) {
    if (next_block + n > r->kv_shape().num_blocks)
      fail("bench: the KV cache ({} blocks) cannot hold batch {} at depth {}{}; lower --batch or --depth, or raise "
           "--gpu-memory-utilization",
           r->kv_shape().num_blocks, max_b, o.depth, o.clone_rows ? "" : " (distinct rows)");
    next_block += n;
    return next_block - n;
  };
  // Row 0 (the pp tests too) owns blocks for max_model_len. Other rows own their blocks (distinct
  // rows) or share row 0's prompt blocks and own their tail (--clone-rows, as prefix caching would).
  std::vector<KvTables> bts(static_cast<size_t>(max_b));
  {
    const int f = take(seq_blocks), s = window > 0 ? take(seq_blocks) : 0;
    for (int i = 0; i < seq_blocks; ++i) {
      bts[0].full.push_back(f + i);
      if (window > 0) bts[0].sliding.push_back(s + i);
    }
  }
  for (int b = 1; b < max_b; ++b) {
    KvTables& t = bts[size_t(b)];
    const int shared = o.clone_rows ? depth_blocks : 0;
    const int f = take(row_blocks - shared);
    const int s = window > 0 ? take(o.clone_rows ? row_blocks - shared : ring) : 0;
    for (int i = 0; i < row_blocks; ++i) {
      t.full.push_back(i < shared ? bts[0].full[size_t(i)] : f + i - shared);
      if (window > 0)
        t.sliding.push_back(o.clone_rows ? (i < shared ? bts[0].sliding[size_t(i)] : s + i - shared) : s + i % ring);
    }
  }
  // Row b's prompt: its own token sequence (row 0's for every row with --clone-rows).
  auto row_tokens = [&](int b, int n) {
    std::vector<int32_t> t(size_t(std::max(n, 1)));
    const uint64_t salt = o.clone_rows ? 0 : uint64_t(b) * 104729;
    for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t((i * 7919 + 13 + salt) % uint64_t(V));
    return t;
  };
  std::vector<int32_t> toks = row_tokens(0, std::max({o.depth, max_pp, 1}));
  auto prefill_row = [&](const std::vector<int32_t>& tk, int start, int n, const KvTables& bt, int chunk) {
    for (int off = 0; off < n; off += chunk) {
      const int len = std::min(chunk, n - off);
      SeqStep s;
      s.tokens = std::span<const int32_t>(tk).subspan(size_t(off), size_t(len));  // tk holds the n tokens
      s.start_pos = start + off;
      s.block_table = bt.full;
      s.sliding_table = bt.sliding;
      s.sample = off + len >= n;
      s.sampling.temperature = 0;  // greedy, as llama-bench: the benchmark measures the engine
      SampleResult res;
      r->step(std::span<const SeqStep>(&s, 1), std::span<SampleResult>(&res, 1));
    }
  };
  auto prefill = [&](int start, int n, const KvTables& bt) { prefill_row(toks, start, n, bt, eo.max_tokens_per_step); };
  const KvTables& bt0 = bts[0];
  if (o.depth > 0) prefill(0, o.depth, bt0);
  // The decode rows' first tokens: each row's next prompt token.
  std::vector<int32_t> first_tok(size_t(max_b), toks[size_t(o.depth) % toks.size()]);
  if (!o.clone_rows)
    for (int b = 1; b < max_b; ++b) {
      const std::vector<int32_t> tb = row_tokens(b, o.depth + 1);
      if (o.depth > 0) prefill_row(tb, 0, o.depth, bts[size_t(b)], fill_chunk);
      first_tok[size_t(b)] = tb[size_t(o.depth)];
    }
  struct Row {
    std::string test;
    int batch;
    Stat tps;
    double gbps = 0, pct = 0, bytes = 0, experts = 0;  // experts: distinct a layer
    bool experts_counted = false;                      // counted from the routing, else expected
    int drafts = 0;                                    // > 0: steps checking this many drafts a row
  };
  std::vector<Row> rows;
  for (int n : o.pp) {
    prefill(o.depth, n, bt0);  // warm-up
    rows.push_back({"pp" + std::to_string(n), 1, stat(timed_rates(o.reps, n, [&] { prefill(o.depth, n, bt0); }))});
  }
  // Decode steps that check K drafts a row, as the engine's n-gram speculation runs them: each row's token
  // and K drafts, the drafts' rows reporting their argmax (prompt log-probs, top 1). Every draft counts as
  // accepted (tok/s is the ceiling); the cost does not depend on acceptance, so the step time against the
  // plain step's says how many accepted drafts a step pay for it.
  auto time_drafts = [&](int n, int B, double plain_tps) {
    const int K = o.spec_tokens, W = 1 + K;
    std::vector<int32_t> tk(size_t(B) * W);
    std::vector<SeqStep> steps(static_cast<size_t>(B));
    std::vector<SampleResult> out(static_cast<size_t>(B));
    auto set_row = [&](int b, int32_t token) {  // the drafts: the row's next ids, pseudo-random
      tk[size_t(b) * W] = token;
      for (int i = 1; i < W; ++i) tk[size_t(b) * W + i] = int32_t((uint64_t(token) + uint64_t(i) * 7919 + 1) % uint64_t(V));
    };
    auto run = [&] {
      for (int b = 0; b < B; ++b) set_row(b, first_tok[size_t(b)]);
      for (int t = 0; t < n; ++t) {
        for (int b = 0; b < B; ++b) {
          SeqStep& st = steps[size_t(b)];
          st = greedy_step(std::span<const int32_t>(tk).subspan(size_t(b) * W, size_t(W)), o.depth + t * W, bts[size_t(b)]);
          st.seq_id = b;
          st.rng_step = uint64_t(t);
          st.prompt_targets = st.tokens.subspan(1);
          st.prompt_top = 1;
        }
        r->step(steps, out);
        for (int b = 0; b < B; ++b) set_row(b, out[size_t(b)].token);
      }
    };
    run();  // warm-up
    Row row{"tg" + std::to_string(n) + "+d" + std::to_string(K), B, stat(timed_rates(o.reps, double(n) * W * B, run))};
    row.drafts = K;
    const double plain_ms = 1e3 * B / plain_tps, spec_ms = 1e3 * W * B / row.tps.mean;
    std::fprintf(stderr, "tg%d batch %d, %d drafts a row: step %.3f ms against %.3f ms plain: the drafts pay from %.2f "
                 "accepted a step\n", n, B, K, spec_ms, plain_ms, spec_ms / plain_ms - 1);
    return row;
  };
  for (int n : o.tg)
    for (int B : o.batch) {
      std::vector<int32_t> tk(B);
      std::vector<SeqStep> steps(B);
      std::vector<SampleResult> out(B);
      auto set_steps = [&](int t) {
        for (int b = 0; b < B; ++b) {
          steps[b].seq_id = b;
          steps[b].tokens = std::span<const int32_t>(&tk[b], 1);
          steps[b].start_pos = o.depth + t;
          steps[b].block_table = bts[size_t(b)].full;
          steps[b].sliding_table = bts[size_t(b)].sliding;
          steps[b].sample = true;
          steps[b].sampling.temperature = 0;
          steps[b].rng_step = uint64_t(t);
          steps[b].expect_next = t + 1 < n;  // as the server's engine says it (max_tokens)
        }
      };
      auto run_tg = [&] {
        for (int b = 0; b < B; ++b) tk[b] = first_tok[size_t(b)];
        for (int t = 0; t < n; ++t) {
          set_steps(t);
          r->step(steps, out);
          for (int b = 0; b < B; ++b) tk[b] = out[b].token;
        }
      };
      run_tg();  // warm-up
      const uint64_t used0 = r->decode_ahead_stats().used;
      const std::vector<double> v = timed_rates(o.reps, double(n) * B, run_tg);
      std::fprintf(stderr, "tg%d batch %d: %llu of %d steps were enqueued ahead (decode ahead)\n", n, B,
                   static_cast<unsigned long long>(r->decode_ahead_stats().used - used0), n * o.reps);
      Row row{"tg" + std::to_string(n), B, stat(v)};
      // The experts this batch reads: counted from a profiled step at the test's last position where
      // the step takes the prefill path (which routes on the device's grouped lists), else expected
      // under uniform routing.
      const DeviceShape shape = DeviceShape::of(r->config(), eo.dense);
      row.experts = expected_distinct_experts(shape, B);
      if (B > 8 && o.tp.nnodes == 1) {  // (profiling reaches this host's ranks only)
        set_steps(n);  // tk holds each row's next token; rows own blocks up to depth + max_tg
        hooks.set_profiling(true);
        r->step(steps, out);
        hooks.set_profiling(false);
        const std::vector<int> routed = hooks.last_routed_experts();
        if (!routed.empty()) {
          row.experts = 0;
          for (int e : routed) row.experts += double(e) / routed.size();
          row.experts_counted = true;
        }
      }
      // KV read per token: every full layer reads the context, every sliding layer its window
      // (clone rows share one context, so theirs is an upper bound of what the GPU reads).
      const auto& c = r->config();
      const double ctx = o.depth + n / 2.0;
      double kv_bytes = 0;
      for (int l = 0; l < c.num_layers; ++l)
        kv_bytes += (window > 0 && c.layer_is_sliding[size_t(l)] ? std::min<double>(ctx, window) : ctx) * c.kv_dim() * 2 *
                    (eo.kv_fp8 ? 1 : 2);
      row.bytes = step_weight_bytes(shape, row.experts * c.num_layers, B) / B + kv_bytes;
      row.gbps = row.bytes * row.tps.mean / 1e9;
      row.pct = 100.0 * row.gbps / (copy_gbps * eo.tp.size);  // tensor parallel: of every GPU's bandwidth
      rows.push_back(row);
      if (o.spec_tokens > 0) rows.push_back(time_drafts(n, B, row.tps.mean));
    }
  const std::string model = o.model.empty() ? "dummy " + o.preset : o.model;
  if (o.breakdown) {
    print_breakdown(*r, hooks, bt0, o.depth, copy_gbps, 1);
    if (!o.no_graphs && o.tp.size == 1) print_graph_marginals(*r, hooks, bt0, o.depth);  // leaves kernels out on rank 0 only
    print_breakdown(*r, hooks, bt0, o.depth, copy_gbps, std::min(max_pp, eo.max_tokens_per_step));
    for (int B : o.batch) {
      if (B < 2) continue;
      std::vector<SeqStep> steps(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b) {
        steps[size_t(b)] = greedy_step(std::span<const int32_t>(&first_tok[size_t(b)], 1), o.depth, bts[size_t(b)]);
        steps[size_t(b)].seq_id = b;
      }
      print_breakdown(*r, hooks, steps,
                      "one decode step of " + std::to_string(B) + (o.clone_rows ? " clone" : " distinct") +
                          " rows at depth " + std::to_string(o.depth),
                      copy_gbps);
      if (B > 8 && !o.no_graphs && o.tp.size == 1) print_wide_graph_marginals(*r, hooks, steps);
    }
  }
  if (!o.step_trace.empty()) write_step_trace(*r, hooks, bt0, o.depth, o.step_trace, o.tp.size > 1);
  if (o.json) {
    std::printf("{\"model\":\"%s\",\"gpu\":\"%s\",\"depth\":%d,\"copy_gbps\":%.1f,\"rows\":\"%s\","
                "\"tensor_parallel_size\":%d,\"expert_parallel\":%s,\"results\":[",
                model.c_str(), cuda_device_name().c_str(), o.depth, copy_gbps, o.clone_rows ? "clone" : "distinct",
                o.tp.size, o.tp.moe == MoeSplit::kExperts ? "true" : "false");
    for (size_t i = 0; i < rows.size(); ++i)
      std::printf("%s{\"test\":\"%s\",\"batch\":%d,\"tok_s\":%.2f,\"sd\":%.2f,\"bytes_per_token\":%.0f,\"gbps\":%.1f,\"pct_copy_bw\":%.1f,"
                  "\"experts_per_layer\":%.1f,\"experts_counted\":%s}",
                  i ? "," : "", rows[i].test.c_str(), rows[i].batch, rows[i].tps.mean, rows[i].tps.sd, rows[i].bytes,
                  rows[i].gbps, rows[i].pct, rows[i].experts, rows[i].experts_counted ? "true" : "false");
    std::printf("]}\n");
  } else {
    std::printf("model %s | GPU %s%s | depth %d | D2D copy bandwidth %.1f GB/s | reps %d | %s rows\n", model.c_str(),
                cuda_device_name().c_str(),
                o.tp.size == 1 ? ""
                : fmt::format(" x {} (tensor parallel{})", o.tp.size,
                              o.tp.moe == MoeSplit::kExperts ? ", whole experts" : "").c_str(),
                o.depth, copy_gbps, o.reps, o.clone_rows ? "clone" : "distinct");
    std::printf("| test | batch | tok/s | experts/layer | MB/token | GB/s | %% copy BW |\n|---|---|---|---|---|---|---|\n");
    for (auto& r2 : rows) {
      char ex[32] = "";
      if (r2.test[0] == 't' && !r2.drafts) std::snprintf(ex, sizeof ex, "%s%.1f", r2.experts_counted ? "" : "~", r2.experts);
      std::printf("| %s @ d%d | %d | %.1f ± %.1f | %s | %.1f | %.0f | %.1f |\n", r2.test.c_str(), o.depth, r2.batch,
                  r2.tps.mean, r2.tps.sd, ex, r2.bytes / 1e6, r2.gbps, r2.pct);
    }
    std::printf("experts/layer: distinct experts a layer, counted from one step's routing (~: expected under uniform "
                "routing, steps of up to 8 tokens)\n");
  }
}
#endif

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Prefill/decode throughput (llama-bench method) on the CUDA engine");
  auto o = std::make_shared<BenchOptions>();
  cmd->add_option("--preset", o->preset, "dummy weights at this shape: 120b | 20b");
  cmd->add_option("--model", o->model, "checkpoint directory");
  cmd->add_option("--pp", o->pp, "prefill lengths")->delimiter(',');
  cmd->add_option("--tg", o->tg, "decode lengths")->delimiter(',');
  cmd->add_option("--batch", o->batch, "decode batch sizes")->delimiter(',');
  cmd->add_option("--depth", o->depth, "KV depth filled before each test")->check(CLI::NonNegativeNumber);
  cmd->add_option("--reps", o->reps, "repetitions")->check(CLI::PositiveNumber);
  cmd->add_option("--gpu-memory-utilization", o->gpu_mem, "fraction of GPU memory to use")->check(CLI::Range(0.05, 1.0));
  add_format_flags(cmd, &o->formats);
  add_parallel_flags(cmd, &o->tp);
  cmd->add_option("--prefill-min-tokens", o->prefill_min_tokens,
                  "steps with at least this many tokens take the tensor-core prefill path (default: the engine's)");
  cmd->add_flag("--json", o->json, "JSON output");
  cmd->add_option("--step-trace", o->step_trace,
                  "write the timeline of a 1-token decode step (CSV) here: per CTA of the six launches per layer "
                  "(default; a summary goes to stderr) or the persistent step's items (--decode-step-min-tokens 1); "
                  "under --tensor-parallel-size, rank 0's");
  cmd->add_flag("--breakdown", o->breakdown, "per-kernel time and bytes of one decode step");
  cmd->add_flag("--no-graphs", o->no_graphs, "launch decode kernels one by one (no CUDA graphs, narrow or wide)");
  cmd->add_option("--decode-step-min-tokens", o->decode_step_min_tokens,
                  "decode steps with at least this many tokens run as one persistent kernel, smaller ones as six "
                  "launches per layer (1: always persistent, 9: never; --breakdown always launches per op)")
      ->check(CLI::Range(1, 9));
  cmd->add_flag("--clone-rows", o->clone_rows,
                "decode rows share one prompt's KV and start from the same token, so every row computes the same "
                "tokens and routes to the same experts (the old, optimistic batch figures); default: every row "
                "has its own prompt and token stream");
  cmd->add_option("--spec-tokens", o->spec_tokens,
                  "also time each tg test's steps checking this many drafts a row (speculation's verification "
                  "steps; every draft counted as accepted, so tok/s is the ceiling) and print what they cost")
      ->check(CLI::Range(0, 16));
  cmd->add_flag("--no-decode-ahead", o->no_decode_ahead,
                "each decode step waits for the host's turn instead of being enqueued before the previous "
                "step's results are read (A/B)");
  cmd->callback([o] {
#ifdef MXSERVE_HAVE_CUDA
    run_bench(*o);
#else
    fail("bench needs the CUDA engine (this build has MXSERVE_CUDA off)");
#endif
  });
}

}  // namespace mx::cli

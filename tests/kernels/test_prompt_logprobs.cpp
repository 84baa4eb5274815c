// Prompt log-probs on the CUDA runner (SeqStep::prompt_targets: completions' echo, vLLM's prompt_logprobs)
// against the CPU reference: each prompt row's target log-prob, rank and top ids on the decode path
// (chunks of 8 tokens) and the prefill path, across steps, in more rows than a launch takes
// (MemoryPlan::prompt_rows), beside sampled rows whose logits they must leave alone, and under tensor
// parallelism. Tolerance: the targets' log-probs within kLogprobTol of the reference's (bf16 activations and
// KV against fp32: mini's random layers reach ~0.1 relative L2 in the logits, test_cuda_engine.cpp; worst
// seen 0.17). The top ids are the GPU's best of its own logits, so their error is the largest of 200k
// (up to ~1.1 seen) and mini's top logits lie closer than that: they are checked against the row itself
// (in order; a rank-1 target is the first of them, at the same log-prob); their order and ties against the
// host's are TokenLogprobs' (test_token_logprobs.cpp, exact).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "kernels/comm/nccl_comm.h"
#include "kernels/engine/cuda_runner.h"
#include "model/checkpoint.h"
#include "model/cpu_reference.h"
#include "model/sampler.h"
#include "model/weights.h"
#include "tests/kernels/cuda_e2e_util.h"

namespace {

constexpr double kLogprobTol = 0.3;

struct Case {
  const char* preset;
  int nseq, P;                 // sequence s: a prompt of P + 3 s tokens
  int chunk;                   // prompt tokens a step
  int top;                     // alternatives a prompt row reports
  int prefill_min_tokens = 0;  // 1 << 30: the decode path only
  int tp = 1;
  int seats = 0;               // max_num_seqs (0: nseq): a launch takes up to max(8, seats) rows
};

// Sequence s runs its prompt in chunks of c.chunk (each chunk's rows report prompt log-probs, all but the
// last prompt row: its next token is the output's), then one sampled token; odd sequences ask for no
// prompt log-probs, and sequence 1 asks for top_logprobs (found on the GPU after the pick).
void expect_prompt_logprobs_match(const Case& c) {
  const std::string dir = mx::test::e2e_fixture(c.preset);
  mx::ModelConfig cfg = mx::load_model_config(dir);
  mx::Checkpoint ck = mx::Checkpoint::open(dir);
  mx::ModelWeights w = mx::bind_weights(ck, cfg);
  mx::ThreadPool pool(4);
  mx::CpuReference ref(cfg, w, &pool);

  const int bs = 4, N = c.P + 3 * (c.nseq - 1) + 2, nblk = (N + bs - 1) / bs;
  mx::CudaEngineOptions opt = mx::test::small_options(dir, c.nseq, nblk * bs, bs, 256, 2 * nblk * c.nseq + 5);
  opt.keep_logits = true;
  if (c.seats > 0) opt.max_num_seqs = c.seats;
  opt.prefill_min_tokens = c.prefill_min_tokens;
  opt.tp.size = c.tp;
  auto gpu = mx::make_cuda_runner(opt);

  std::vector<std::vector<int32_t>> toks(size_t(c.nseq), std::vector<int32_t>(size_t(N)));
  std::mt19937 rng(23);
  for (auto& t : toks) for (auto& v : t) v = int32_t(rng() % uint32_t(cfg.vocab_size));
  std::vector<std::vector<int32_t>> bt(size_t(c.nseq)), sw(size_t(c.nseq));
  for (int s = 0; s < c.nseq; ++s)
    for (int b = 0; b < nblk; ++b) {
      bt[size_t(s)].push_back(b * c.nseq + s + 5);
      sw[size_t(s)].push_back(nblk * c.nseq + 5 + b * c.nseq + s);
    }
  mx::CpuKvCache kv;
  kv.allocate(cfg, bs, opt.num_kv_blocks);
  std::vector<std::vector<float>> ref_logits(size_t(c.nseq) * N, std::vector<float>(size_t(cfg.vocab_size)));
  for (int s = 0; s < c.nseq; ++s)
    for (int p = 0; p < N; ++p)
      ref.forward_token(toks[size_t(s)][size_t(p)], p, bt[size_t(s)].data(), sw[size_t(s)].data(), kv,
                        ref_logits[size_t(s) * N + p].data());

  std::vector<int> done(size_t(c.nseq), 0);
  double worst = 0, worst_sampled = 0;
  int rows = 0, top_ids = 0;
  for (int st = 0;; ++st) {
    std::vector<mx::SeqStep> seqs;
    std::vector<int> which;
    for (int s = 0; s < c.nseq; ++s) {
      const int len = c.P + 3 * s, left = len - done[size_t(s)];
      if (left <= 0) continue;
      const int n = std::min(c.chunk, left);
      mx::SeqStep q;
      q.seq_id = s;
      q.tokens = std::span<const int32_t>(toks[size_t(s)]).subspan(size_t(done[size_t(s)]), size_t(n));
      q.start_pos = done[size_t(s)];
      q.block_table = bt[size_t(s)];
      q.sliding_table = sw[size_t(s)];
      q.sample = n == left;
      q.sampling.temperature = 0.f;
      q.sampling.logprobs = true;
      q.sampling.top_logprobs = s == 1 ? 2 : 0;
      const int rows_here = std::min(n, len - 1 - done[size_t(s)]);  // every row whose next token is the prompt's
      if (s % 2 == 0 && rows_here > 0) {
        q.prompt_row0 = 0;
        q.prompt_targets = std::span<const int32_t>(toks[size_t(s)]).subspan(size_t(done[size_t(s)]) + 1, size_t(rows_here));
        q.prompt_top = s == 2 ? c.top / 2 : c.top;  // launches take rows of several sequences: each keeps its own
      }
      seqs.push_back(q);
      which.push_back(s);
    }
    if (seqs.empty()) break;
    std::vector<mx::SampleResult> out(seqs.size());
    gpu->step(seqs, out);
    int sampled = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int s = which[i], p0 = done[size_t(s)];
      const mx::SeqStep& q = seqs[i];
      ASSERT_EQ(out[i].prompt.size(), q.prompt_targets.size()) << "step " << st << " seq " << s;
      for (size_t j = 0; j < q.prompt_targets.size(); ++j) {
        const int p = p0 + int(j);
        const auto& r = ref_logits[size_t(s) * N + p];
        // (one id more than asked: the gap after the last one)
        const int top = q.prompt_top;
        const mx::TokenLogprob want = mx::token_logprob(r.data(), cfg.vocab_size, q.prompt_targets[j], 0);
        const mx::TokenLogprob& got = out[i].prompt[j];
        EXPECT_EQ(got.token, q.prompt_targets[j]);
        EXPECT_GE(got.rank, 1);
        const double d = std::abs(double(got.logprob) - want.logprob);
        worst = std::max(worst, d);
        EXPECT_LT(d, kLogprobTol) << c.preset << " seq " << s << " pos " << p;
        ASSERT_EQ(int(got.top.size()), top);
        for (int k = 0; k < top; ++k) {
          if (k > 0) {
            EXPECT_GE(got.top[size_t(k - 1)].second, got.top[size_t(k)].second);
          }
          const int32_t id = got.top[size_t(k)].first;
          ASSERT_TRUE(id >= 0 && id < cfg.vocab_size);
          ++top_ids;
        }
        if (top > 0) {
          EXPECT_GE(got.top[0].second, got.logprob - 1e-6f);
          EXPECT_EQ(got.rank == 1, got.top[0].first == got.token) << "seq " << s << " pos " << p;
          if (got.top[0].first == got.token) {
            EXPECT_EQ(got.top[0].second, got.logprob);
          }
        }
        ++rows;
      }
      if (q.sample) {  // the sampled row's logits (kept) are untouched by the prompt rows' launches
        const auto g = gpu->last_logits(sampled++);
        const auto& r = ref_logits[size_t(s) * N + p0 + int(q.tokens.size()) - 1];
        double num = 0, den = 0;
        for (int v = 0; v < cfg.vocab_size; ++v) {
          num += (g[size_t(v)] - r[size_t(v)]) * double(g[size_t(v)] - r[size_t(v)]);
          den += double(r[size_t(v)]) * r[size_t(v)];
        }
        worst_sampled = std::max(worst_sampled, std::sqrt(num / den));
      }
      done[size_t(s)] += int(q.tokens.size());
    }
  }
  EXPECT_GT(rows, 0);
  EXPECT_LT(worst_sampled, 1.5e-1);
  std::printf("[%s prompt log-probs, %d seqs, chunks of %d, top %d, prefill >= %d tokens, %d GPU] %d rows, worst "
              "|log-prob - reference| %.3e, %d top ids; sampled rows' worst relative L2 %.3e\n",
              c.preset, c.nseq, c.chunk, c.top, c.prefill_min_tokens, c.tp, rows, worst, top_ids, worst_sampled);
}

TEST(PromptLogprobs, TinyDecodePathMatchesCpuReference) { expect_prompt_logprobs_match({"tiny", 3, 9, 5, 3}); }
TEST(PromptLogprobs, MiniPrefillPathMatchesCpuReference) { expect_prompt_logprobs_match({"mini", 3, 30, 24, 20}); }
TEST(PromptLogprobs, MiniDecodePathMatchesCpuReference) {
  expect_prompt_logprobs_match({"mini", 3, 11, 6, 1, 1 << 30});
}
// Many short prompts in one step: a launch takes rows of several sequences.
TEST(PromptLogprobs, MiniShortPromptsShareLaunches) { expect_prompt_logprobs_match({"mini", 11, 5, 64, 4, 0, 1, 16}); }
// 32 seats: launches of up to 32 rows (the lm_head's GEMM), a 48-row prompt in two.
TEST(PromptLogprobs, MiniWholePromptsNoAlternatives) { expect_prompt_logprobs_match({"mini", 4, 40, 64, 0, 0, 1, 32}); }
TEST(PromptLogprobs, MiniTwoGpusMatchCpuReference) {
  int n = 0;
  std::string why;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2 || !mx::cuda::nccl_available(&why))
    GTEST_SKIP() << "needs two GPUs and libnccl.so.2";
  expect_prompt_logprobs_match({"mini", 3, 30, 24, 5, 0, 2});
}

}  // namespace

namespace {

// top_logprobs on the GPU: after the pick, a row that asks for alternatives has them found from its logits
// (token_logprobs over the sampled rows that ask): greedy and temperature rows, one with top-k, one without
// alternatives, on the prefill path (step 0) and wide steps of single-token rows (steps 1-4: the shape repeats
// at step 2, so it is captured behind it and steps 3-4 replay the graph). Against the host's token_logprob
// over the same row's kept logits: ids exact, log-probs within 2e-5; the pick's own log-prob is the row's.
TEST(CudaRunner, TopLogprobsOnTheGpu) {
  const std::string dir = mx::test::e2e_fixture("mini");
  const mx::ModelConfig cfg = mx::load_model_config(dir);
  const int nseq = 4, P = 6, bs = 4, N = 12, nblk = N / bs, V = cfg.vocab_size;
  mx::CudaEngineOptions opt = mx::test::small_options(dir, nseq, N, bs, 64, 2 * nblk * nseq + 2);
  opt.keep_logits = true;
  auto gpu = mx::make_cuda_runner(opt);
  std::vector<int32_t> prompt(P);
  for (int i = 0; i < P; ++i) prompt[size_t(i)] = (i * 7919 + 13) % V;
  std::vector<std::vector<int32_t>> bt(nseq), sw(nseq), toks(nseq, prompt);
  for (int s = 0; s < nseq; ++s)
    for (int b = 0; b < nblk; ++b) {
      bt[size_t(s)].push_back(b * nseq + s);
      sw[size_t(s)].push_back(nblk * nseq + b * nseq + s);
    }
  const int tops[nseq] = {3, 2, 0, 5};
  const float temps[nseq] = {0.f, 0.8f, 0.f, 0.7f};
  int checked = 0;
  for (int st = 0; st < 5; ++st) {
    std::vector<mx::SeqStep> seqs(nseq);
    for (int s = 0; s < nseq; ++s) {
      mx::SeqStep& q = seqs[size_t(s)];
      q.seq_id = s;
      q.start_pos = st == 0 ? 0 : P + st - 1;
      q.tokens = std::span<const int32_t>(toks[size_t(s)]).subspan(size_t(q.start_pos), st == 0 ? size_t(P) : 1);
      q.block_table = bt[size_t(s)];
      q.sliding_table = sw[size_t(s)];
      q.sample = true;
      q.sampling.temperature = temps[s];
      q.sampling.seed = 3 + uint64_t(s);
      q.sampling.top_k = s == 3 ? 40 : 0;
      q.sampling.logprobs = true;
      q.sampling.top_logprobs = tops[s];
      q.rng_step = uint64_t(st);
    }
    std::vector<mx::SampleResult> out(nseq);
    gpu->step(seqs, out);
    for (int s = 0; s < nseq; ++s) {
      SCOPED_TRACE("step " + std::to_string(st) + " row " + std::to_string(s));
      const auto lg = gpu->last_logits(s);
      ASSERT_EQ(int(lg.size()), V);
      const mx::TokenLogprob want = mx::token_logprob(lg.data(), V, out[size_t(s)].token, tops[s]);
      EXPECT_NEAR(out[size_t(s)].logprob, want.logprob, 2e-5);
      ASSERT_EQ(out[size_t(s)].top.size(), size_t(tops[s]));
      for (int k = 0; k < tops[s]; ++k) {
        EXPECT_EQ(out[size_t(s)].top[size_t(k)].first, want.top[size_t(k)].first) << k;
        EXPECT_NEAR(out[size_t(s)].top[size_t(k)].second, want.top[size_t(k)].second, 2e-5) << k;
        ++checked;
      }
      if (temps[s] == 0.f && tops[s] > 0) {
        EXPECT_EQ(out[size_t(s)].top[0].first, out[size_t(s)].token);  // greedy: the pick is the best id
      }
      toks[size_t(s)].push_back(out[size_t(s)].token);
    }
  }
  EXPECT_EQ(checked, 5 * (3 + 2 + 5));
}

}  // namespace

// The CUDA engine's sampling against the host's: filtered sampling on the GPU, logit adjustments (bans,
// logit_bias, penalties), host-sampled rows (adjustments past the step's list) and decode
// ahead with them.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "kernels/decode/decode_kernels.h"
#include "kernels/engine/cuda_runner.h"
#include "kernels/engine/memory_plan.h"
#include "kernels/sampling/sample_filtered.h"
#include "model/checkpoint.h"
#include "model/sampler.h"
#include "tests/kernels/cuda_e2e_util.h"
#include "tests/kernels/gpu_test_util.h"

namespace {
using mx::test::e2e_fixture;
using mx::test::small_options;
using mx::test::to_dev;
using mx::test::from_dev;

// The mini model's sampling runs: nseq sequences of one 6-token prompt, blocks of 4 over 12 positions
// (each sequence its own full and sliding blocks), logits kept.
struct MiniRows {
  std::string dir = e2e_fixture("mini");
  mx::ModelConfig cfg = mx::load_model_config(dir);
  int nseq, P = 6, bs = 4, N = 12, nblk = N / bs, V = cfg.vocab_size;
  mx::CudaEngineOptions opt;
  std::vector<int32_t> prompt;
  std::vector<std::vector<int32_t>> bt, sw;
  explicit MiniRows(int n) : nseq(n), opt(small_options(dir, n, N, bs, 64, 2 * nblk * n + 2)), prompt(size_t(P)), bt(n), sw(n) {
    opt.keep_logits = true;
    for (int i = 0; i < P; ++i) prompt[size_t(i)] = (i * 7919 + 13) % V;
    for (int s = 0; s < n; ++s)
      for (int b = 0; b < nblk; ++b) {
        bt[size_t(s)].push_back(b * n + s);
        sw[size_t(s)].push_back(nblk * n + b * n + s);
      }
  }
  // Row s of step st: the prompt (step 0) or the fed token at position P, sampled greedily but row 2 at
  // temperature 0.8 (seed 3).
  mx::SeqStep row(int s, int st, std::span<const int32_t> fed) const {
    mx::SeqStep q;
    q.seq_id = s;
    q.tokens = st == 0 ? std::span<const int32_t>(prompt) : fed;
    q.start_pos = st == 0 ? 0 : P;
    q.block_table = bt[size_t(s)];
    q.sliding_table = sw[size_t(s)];
    q.sample = true;
    q.sampling.temperature = s == 2 ? 0.8f : 0.f;
    q.sampling.seed = 3;
    q.rng_step = uint64_t(st);
    return q;
  }
};

// The GPU's temperature draw (Gumbel-max in the pick kernel) over one row of logits.
int32_t gpu_draw(const std::vector<float>& row, float temperature, uint64_t key) {
  const int V = int(row.size());
  const std::vector<float> it = {1.f / temperature};
  const std::vector<uint64_t> keys = {key};
  float* dlg = to_dev(row);
  float* dit = to_dev(it);
  uint64_t* dkey = to_dev(keys);
  int32_t* dt; float* dl; float* dpart;
  cudaMalloc(&dt, 4); cudaMalloc(&dl, 4);
  cudaMalloc(&dpart, mx::cuda::argmax_scratch_floats(1, V) * 4);
  mx::cuda::launch_argmax_logprob(dlg, 1, V, V, dt, dl, dpart, 0, dit, dkey);
  const int32_t tok = from_dev(dt, 1)[0];
  cudaFree(dlg); cudaFree(dit); cudaFree(dkey); cudaFree(dt); cudaFree(dl); cudaFree(dpart);
  return tok;
}
}  // namespace

// Top-k / top-p / min-p sampling runs on the GPU (kernels/sampling/sample_filtered.h): the token of every
// filtered row is the reference draw from the row's own logits and stream; plain-temperature and greedy
// rows in the same step keep their own picks. Graph replay (decode) and the prefill path both.
TEST(CudaRunner, FilteredSamplingOnGpuMatchesReference) {
  const std::string dir = e2e_fixture("tiny");
  mx::ModelConfig cfg = mx::load_model_config(dir);
  const int nseq = 4, bs = 4, N = 24, nblk = N / bs;
  mx::CudaEngineOptions opt;
  opt.model_dir = dir;
  opt.max_model_len = N;
  opt.max_num_seqs = nseq;
  opt.max_tokens_per_step = 64;
  opt.num_kv_blocks = 2 * nblk * nseq;
  opt.block_size = bs;
  opt.keep_logits = true;
  opt.prefill_min_tokens = 9;
  auto gpu = mx::make_cuda_runner(opt);
  std::vector<std::vector<int32_t>> bt(nseq);
  for (int s = 0; s < nseq; ++s)
    for (int b = 0; b < nblk; ++b) bt[s].push_back(b * nseq + s);
  std::vector<std::vector<int32_t>> sw(nseq);  // the sliding layers' blocks
  for (int s = 0; s < nseq; ++s)
    for (int b = 0; b < nblk; ++b) sw[s].push_back(nblk * nseq + b * nseq + s);
  std::vector<int32_t> toks(N, 0);
  for (int i = 0; i < N; ++i) toks[i] = (i * 37 + 11) % cfg.vocab_size;
  std::vector<int> done(nseq, 0);
  int checked = 0;
  for (int st = 0; st < 6; ++st) {
    std::vector<mx::SeqStep> seqs(nseq);
    for (int s = 0; s < nseq; ++s) {
      const int n = st == 0 ? 10 + s : 1;
      seqs[s].seq_id = s;
      seqs[s].tokens = std::span<const int32_t>(toks.data() + done[s], n);
      seqs[s].start_pos = done[s];
      seqs[s].block_table = bt[s];
      seqs[s].sliding_table = sw[s];
      seqs[s].sample = true;
      seqs[s].rng_step = uint64_t(st);
      mx::SamplingParams& p = seqs[s].sampling;
      p.seed = 100 + s;
      p.temperature = s == 3 ? 0.f : 0.8f;
      if (s == 0) p.top_k = 3;
      if (s == 1) { p.top_p = 0.5f; p.min_p = 0.05f; }
      done[s] += n;
    }
    std::vector<mx::SampleResult> out(nseq);
    gpu->step(seqs, out);
    for (int s = 0; s < 2; ++s) {
      auto g = gpu->last_logits(s);
      const mx::SamplingParams& p = seqs[s].sampling;
      const int want = mx::cuda::sample_filtered_ref(g.data(), cfg.vocab_size, 1.0f / p.temperature,
                                                     mx::sample_stream_key(p.seed, seqs[s].rng_step), p.top_k,
                                                     p.top_p, p.min_p);
      EXPECT_EQ(out[s].token, want) << "step " << st << " seq " << s;
      ++checked;
    }
    auto g3 = gpu->last_logits(3);
    EXPECT_EQ(out[3].token, int(std::max_element(g3.begin(), g3.end()) - g3.begin())) << "greedy row, step " << st;
  }
  EXPECT_EQ(checked, 12);
}

// Banned tokens (min_tokens): a row with SeqStep::banned samples on the host from its copied logits with
// those ids at -inf. Two copies of one prompt in one step (a one-token decode after it too): the banned
// row never takes the free row's greedy pick, and its own pick is the masked row's argmax (greedy) or a
// draw that avoids the ban (temperature 0.8).
// Logit adjustments are made on the GPU before the pick: banned tokens (min_tokens) on greedy,
// temperature and top-k rows, and logit_bias (a +100 bias wins, on a greedy and a temperature row, even
// beside a ban of another id that also has a bias), on the prefill forward (step 0) and in a decode graph
// (step 1). A row whose adjustments do not fit the step's list (MemoryPlan::kAdjPerRow a row of
// max_num_seqs) samples on the host, adjusted there. Either way the banned id is never picked and the copied logits hold -inf there.
TEST(CudaRunner, BannedTokensAreNeverSampled) {
  const MiniRows m(7);
  const int nseq = m.nseq, P = m.P;
  const mx::ModelConfig& cfg = m.cfg;
  const mx::CudaEngineOptions& opt = m.opt;
  const auto &bt = m.bt, &sw = m.sw;
  const std::vector<int32_t>& prompt = m.prompt;
  auto gpu = mx::make_cuda_runner(opt);
  std::vector<int32_t> ban, many, fed(nseq);
  std::vector<mx::LogitBias> bias, bias4;
  int32_t forced = 0, forced4 = 0;
  for (int st = 0; st < 2; ++st) {
    std::vector<mx::SeqStep> seqs(nseq);
    for (int s = 0; s < nseq; ++s) {
      mx::SeqStep& q = seqs[s];
      q.seq_id = s;
      q.tokens = st == 0 ? std::span<const int32_t>(prompt) : std::span<const int32_t>(&fed[s], 1);
      q.start_pos = st == 0 ? 0 : P;
      q.block_table = bt[s];
      q.sliding_table = sw[s];
      q.sample = true;
      q.sampling.temperature = s == 2 || s == 3 || s == 6 ? 0.8f : 0.f;
      if (s == 3) q.sampling.top_k = 20;
      q.sampling.seed = 3;
      q.rng_step = uint64_t(st);
    }
    std::vector<mx::SampleResult> out(nseq);
    if (st == 0) {  // the free row's pick first, to ban it
      gpu->step(std::span<const mx::SeqStep>(seqs).first(1), std::span<mx::SampleResult>(out).first(1));
      ban = {out[0].token, cfg.vocab_size + 5};  // an id past the vocabulary is ignored
      many = ban;
      for (int id = 1; int(many.size()) < mx::MemoryPlan::kAdjPerRow * nseq + 10; ++id)
        if (id != ban[0]) many.push_back(id);
      forced = (ban[0] + 1000) % cfg.vocab_size;
      forced4 = (ban[0] + 2000) % cfg.vocab_size;
      bias = {{ban[0], 50.f}, {forced, 100.f}};
      bias4 = {{forced4, 100.f}};
      gpu = mx::make_cuda_runner(opt);  // a fresh cache for the step with every row
    }
    for (int s = 1; s < 6; ++s) seqs[s].banned = ban;
    seqs[4].banned = many;
    seqs[4].logit_bias = bias4;
    seqs[5].logit_bias = bias;
    seqs[6].logit_bias = bias;
    gpu->step(seqs, out);
    for (int s = 1; s < nseq; ++s) {
      SCOPED_TRACE("row " + std::to_string(s) + ", step " + std::to_string(st));
      auto lg = gpu->last_logits(s);
      ASSERT_EQ(int(lg.size()), cfg.vocab_size);
      ASSERT_TRUE(out[s].token >= 0 && out[s].token < cfg.vocab_size);
      EXPECT_TRUE(std::isfinite(lg[size_t(out[s].token)]));
      EXPECT_TRUE(std::isfinite(out[s].logprob) && out[s].logprob <= 0.f);
      if (s != 6) {
        EXPECT_NE(out[s].token, ban[0]);
        EXPECT_TRUE(std::isinf(lg[size_t(ban[0])]) && lg[size_t(ban[0])] < 0);
      }
      const int greedy = int(std::max_element(lg.begin(), lg.end()) - lg.begin());
      EXPECT_TRUE((s != 1 && s != 4 && s != 5) || out[s].token == greedy);
      EXPECT_EQ(out[s].token, s == 4 ? forced4 : s >= 5 ? forced : out[s].token);
    }
    if (st == 0) {
      EXPECT_EQ(out[0].token, ban[0]);  // the same prompt unbanned: the same pick as before
    }
    for (int s = 0; s < nseq; ++s) fed[s] = out[s].token;
  }
}

// Decode ahead (CudaEngineOptions::decode_ahead) enqueues the next one-token step, fed by the GPU's own
// picks, before the current step's results are read. Its results must be those of the step the caller
// then asks for, bit for bit, and a step that asks for something else must run as if nothing had been
// enqueued: here a fed token that is not the pick, a sequence that leaves, and tables that end at the
// current block (nothing enqueued). Greedy and plain-temperature rows; blocks of 4, so steps cross blocks;
// a greedy row's random stream (rng_step) does not have to advance for its step to be used (4).
namespace {
struct AheadRun {
  std::vector<int32_t> tok;
  std::vector<float> lp;
  uint64_t used = 0, launched = 0;
  double busy_s = 0, wall_s = 0;  // the runner's device_busy_seconds, and the steps' wall time
};

// nseq rows: 3 make one-token graph steps, more than 8 wide ones (37: padded to 40).
AheadRun decode_ahead_run(bool ahead, int scenario, std::span<const int32_t> ban = {}, int nseq = 3) {
  const std::string dir = e2e_fixture("mini");
  const mx::ModelConfig cfg = mx::load_model_config(dir);
  const int P = 5, steps = 14, bs = 4, N = P + steps + 1, nblk = (N + bs - 1) / bs;
  mx::CudaEngineOptions opt = small_options(dir, nseq, nblk * bs, bs, std::max(64, nseq * P), 2 * nblk * nseq + 2);
  opt.decode_ahead = ahead;
  auto gpu = mx::make_cuda_runner(opt);
  std::vector<std::vector<int32_t>> bt(nseq), sw(nseq);
  for (int s = 0; s < nseq; ++s)
    for (int b = 0; b < nblk; ++b) {
      bt[s].push_back((nblk - 1 - b) * nseq + s + 1);
      sw[s].push_back(nblk * nseq + 2 + b * nseq + s);
    }
  std::vector<int32_t> prompt(P);
  for (int i = 0; i < P; ++i) prompt[i] = (i * 7919 + 13) % cfg.vocab_size;
  const std::vector<mx::LogitBias> bias5 = {{cfg.vocab_size - 7, 100.f}};
  std::vector<uint64_t> only6(size_t(cfg.vocab_size + 63) / 64, 0);  // the one id cfg.vocab_size - 5
  only6[size_t(cfg.vocab_size - 5) / 64] |= uint64_t(1) << ((cfg.vocab_size - 5) % 64);
  AheadRun r;
  std::vector<int32_t> last(nseq);
  std::vector<int> rows(nseq);  // the sequences still running
  std::iota(rows.begin(), rows.end(), 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int st = 0; st <= steps; ++st) {
    if (scenario == 2 && st == 9) rows.pop_back();            // the last sequence leaves
    if (scenario == 7 && st == 9) rows.erase(rows.begin());   // the first one leaves: the others' picks move
    const int live = int(rows.size());
    std::vector<mx::SeqStep> seqs(live);
    std::vector<int32_t> fed(nseq);
    for (int k = 0; k < live; ++k) {
      const int s = rows[k];
      mx::SeqStep& q = seqs[k];
      const int pos = st == 0 ? 0 : P + st - 1;
      fed[s] = last[s];
      if (scenario == 1 && st == 6 && s == 0) fed[s] = (last[s] + 1) % cfg.vocab_size;  // not the pick
      q.seq_id = s;
      q.tokens = st == 0 ? std::span<const int32_t>(prompt) : std::span<const int32_t>(&fed[s], 1);
      q.start_pos = pos;
      const int covered = scenario == 3 && st >= 4 ? (pos + int(q.tokens.size()) + bs - 1) / bs : nblk;
      q.block_table = std::span<const int32_t>(bt[s]).first(covered);
      q.sliding_table = std::span<const int32_t>(sw[s]).first(covered);
      q.sample = true;
      q.sampling.temperature = s == 1 ? 0.7f : 0.f;
      q.sampling.seed = 5 + s;
      q.rng_step = scenario == 4 && s != 1 ? 0 : uint64_t(st);  // 4: greedy rows' streams unchanged
      q.expect_next = st < steps;
      if (scenario == 5 && s < 2 && st < 8) q.banned = ban;  // 5: rows 0 and 1 banned until their min_tokens,
      if (scenario == 5 && s == 2) q.logit_bias = bias5;      // row 2 biased throughout
      if (scenario == 6 && s == 0 && st >= 6) q.allowed = only6;  // 6: row 0 constrained from step 6 on
    }
    std::vector<mx::SampleResult> out(live);
    gpu->step(seqs, out);
    for (int k = 0; k < live; ++k) {
      last[rows[k]] = out[k].token;
      r.tok.push_back(out[k].token);
      r.lp.push_back(out[k].logprob);
    }
  }
  r.used = gpu->decode_ahead_stats().used;
  r.launched = gpu->decode_ahead_stats().launched;
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.busy_s = gpu->device_busy_seconds();
  return r;
}

void expect_ahead_same_tokens(int nseq) {
  for (int scenario : {0, 1, 2, 3, 4, 7}) {
    SCOPED_TRACE("scenario " + std::to_string(scenario) + ", " + std::to_string(nseq) + " rows");
    const AheadRun want = decode_ahead_run(false, scenario, {}, nseq), got = decode_ahead_run(true, scenario, {}, nseq);
    EXPECT_EQ(want.used, 0u);
    EXPECT_EQ(got.tok, want.tok);
    ASSERT_EQ(got.lp.size(), want.lp.size());
    EXPECT_EQ(std::memcmp(got.lp.data(), want.lp.data(), got.lp.size() * 4), 0);
    std::printf("scenario %d: %llu steps enqueued ahead, %llu used\n", scenario, (unsigned long long)got.launched,
                (unsigned long long)got.used);
    // 14 decode steps: the first is asked for after the prompt step (not a graph step), the last expects
    // no successor. Scenario 1 wastes one (a token not the pick); in 2 and 7 the step enqueued with a row
    // that then left runs the others (their next one reads its picks); 3 enqueues only within a block.
    if (scenario == 0 || scenario == 2 || scenario == 4 || scenario == 7) {
      EXPECT_EQ(got.used, 13u);
      EXPECT_EQ(got.launched, 13u);
    } else if (scenario == 3) {
      EXPECT_LT(got.launched, 13u);
    } else {
      EXPECT_EQ(got.launched, got.used + 1);
    }
    EXPECT_GT(got.used, 0u);
    // The GPU's time in the steps, from its events: some, and within the steps' wall time.
    for (const AheadRun* run : {&want, &got}) {
      EXPECT_GT(run->busy_s, 0.0);
      EXPECT_LT(run->busy_s, run->wall_s);
    }
  }
}
}  // namespace

TEST(CudaRunner, DecodeAheadGivesTheSameTokens) { expect_ahead_same_tokens(3); }

// Wide decode steps (more than 8 rows: the prefill forward, its embedding reading the picks) run ahead too;
// 9 rows become a graph step of 8 when one leaves.
TEST(CudaRunner, WideDecodeAheadGivesTheSameTokens) {
  expect_ahead_same_tokens(9);
  expect_ahead_same_tokens(12);
  expect_ahead_same_tokens(37);
}

// Bans and biases in decode ahead (scenario 5): the step enqueued ahead carries the step before's, so it is
// used while they stay and dropped where the bans lift; the tokens are those of steps run one at a time.
TEST(CudaRunner, DecodeAheadWithBannedTokens) {
  const AheadRun free = decode_ahead_run(false, 0);
  const int nseq = 3;
  const std::vector<int32_t> ban = {free.tok[size_t(nseq)], free.tok[size_t(nseq) + 1], free.tok[size_t(2 * nseq)]};
  const AheadRun want = decode_ahead_run(false, 5, ban), got = decode_ahead_run(true, 5, ban);
  EXPECT_EQ(got.tok, want.tok);
  ASSERT_EQ(got.lp.size(), want.lp.size());
  EXPECT_EQ(std::memcmp(got.lp.data(), want.lp.data(), got.lp.size() * 4), 0);
  for (int st = 0; st < 8; ++st)
    for (int s = 0; s < 2; ++s)
      for (int32_t b : ban) EXPECT_NE(want.tok[size_t(st * nseq + s)], b) << "step " << st << " row " << s;
  EXPECT_NE(want.tok, free.tok);  // the bans changed something
  for (size_t i = 2; i < want.tok.size(); i += nseq) EXPECT_EQ(want.tok[i], want.tok[2]);  // row 2: the +100 bias
  EXPECT_EQ(got.launched, got.used + 1);  // the step enqueued with the bans that lifted
  EXPECT_GT(got.used, 10u);
}

// A row constrained from a step on (scenario 6: structured output's final channel opening) was picked ahead
// without its mask: that step is dropped, and the tokens are those of steps run one at a time, the
// constrained row's its one allowed id.
TEST(CudaRunner, DecodeAheadDropsARowConstrainedSince) {
  const int nseq = 3, V = mx::load_model_config(e2e_fixture("mini")).vocab_size;
  const AheadRun want = decode_ahead_run(false, 6), got = decode_ahead_run(true, 6);
  EXPECT_EQ(got.tok, want.tok);
  ASSERT_EQ(got.lp.size(), want.lp.size());
  EXPECT_EQ(std::memcmp(got.lp.data(), want.lp.data(), got.lp.size() * 4), 0);
  for (size_t st = 6; st * nseq < want.tok.size(); ++st) EXPECT_EQ(want.tok[st * nseq], V - 5) << "step " << st;
  EXPECT_GT(got.used, 0u);
}

// Penalized rows (presence / frequency / repetition) are adjusted on the GPU before the pick: their copied
// logits are the raw logits with the penalties applied over the given history (the prompt, then the output
// fed so far) bit for bit as penalize_tokens does; a greedy row takes their argmax, a temperature row the
// pick kernel's draw from them, and a penalized greedy row that asks for top_logprobs the same argmax. A row
// without penalties in the same step keeps its pick. The prefill forward (step 0) and a decode graph (step 1),
// fed the same tokens in both runs.
TEST(CudaRunner, PenalizedRowsSampleOnTheGpu) {
  const MiniRows m(4);
  const int nseq = m.nseq, P = m.P, V = m.V;
  const std::vector<int32_t>& prompt = m.prompt;
  std::vector<int32_t> fed(nseq), hist;
  struct Run { std::vector<mx::SampleResult> out; std::vector<std::vector<float>> logits; };
  auto run = [&](bool penalize) {
    std::vector<Run> runs(2);
    auto gpu = mx::make_cuda_runner(m.opt);
    for (int st = 0; st < 2; ++st) {
      hist = prompt;
      if (st == 1) hist.push_back(fed[0]);
      std::vector<mx::SeqStep> seqs(nseq);
      for (int s = 0; s < nseq; ++s) {
        mx::SeqStep& q = seqs[s] = m.row(s, st, std::span<const int32_t>(&fed[0], 1));
        if (s == 3) q.sampling.top_logprobs = 2;
        if (penalize && s > 0) {
          q.sampling.presence_penalty = 0.5f;
          q.sampling.frequency_penalty = 0.25f;
          q.sampling.repetition_penalty = 2.f;
          q.history = hist;
          q.prompt_len = P;
        }
      }
      runs[st].out.resize(nseq);
      gpu->step(seqs, runs[st].out);
      for (int s = 0; s < nseq; ++s) {
        auto lg = gpu->last_logits(s);
        runs[st].logits.emplace_back(lg.begin(), lg.end());
      }
      if (st == 0) fed[0] = runs[0].out[0].token;  // the same token in both runs
    }
    return runs;
  };
  const std::vector<Run> free = run(false), pen = run(true);
  std::vector<int32_t> scratch;
  std::vector<float> fscratch;
  for (int st = 0; st < 2; ++st) {
    hist = prompt;
    if (st == 1) hist.push_back(fed[0]);
    EXPECT_EQ(pen[st].out[0].token, free[st].out[0].token) << "step " << st;
    for (int s = 1; s < nseq; ++s) {
      SCOPED_TRACE("row " + std::to_string(s) + ", step " + std::to_string(st));
      mx::SamplingParams p;
      p.temperature = s == 2 ? 0.8f : 0.f;
      p.seed = 3;
      p.top_logprobs = s == 3 ? 2 : 0;
      p.presence_penalty = 0.5f;
      p.frequency_penalty = 0.25f;
      p.repetition_penalty = 2.f;
      std::vector<float> want = free[st].logits[size_t(s)];
      ASSERT_EQ(int(want.size()), V);
      mx::penalize_tokens(want.data(), V, p, hist, P, scratch);
      ASSERT_EQ(pen[st].logits[size_t(s)].size(), want.size());
      EXPECT_EQ(std::memcmp(pen[st].logits[size_t(s)].data(), want.data(), want.size() * 4), 0);
      if (s == 2) {  // the GPU's draw over the penalized row: the pick kernel on the expected logits
        EXPECT_EQ(pen[st].out[s].token, gpu_draw(want, p.temperature, mx::sample_stream_key(p.seed, uint64_t(st))));
        continue;
      }
      EXPECT_EQ(pen[st].out[s].token, mx::sample_token(want.data(), V, p, uint64_t(st), fscratch).token);
    }
  }
}

// Constrained rows (SeqStep::allowed, structured output) are masked on the GPU after the adjustments: their
// copied logits are -inf outside the allowed ids, a greedy row takes the best allowed id of the free row's
// logits (the same prompt and fed token in every row), a temperature row the pick kernel's draw over the
// masked row; a constrained row that asks for top_logprobs picks the same best allowed id.
// On the prefill forward (step 0) and a decode graph (step 1).
TEST(CudaRunner, ConstrainedRowsSampleOnTheGpu) {
  const MiniRows m(4);
  const int nseq = m.nseq, V = m.V;
  auto gpu = mx::make_cuda_runner(m.opt);
  const std::vector<int32_t> ids = {5, 77, 1000, V - 2};
  std::vector<uint64_t> bits(size_t(V + 63) / 64, 0);
  for (int32_t id : ids) bits[size_t(id) / 64] |= uint64_t(1) << (id % 64);
  std::vector<int32_t> fed(1);
  for (int st = 0; st < 2; ++st) {
    SCOPED_TRACE("step " + std::to_string(st));
    std::vector<mx::SeqStep> seqs(nseq);
    for (int s = 0; s < nseq; ++s) {
      seqs[s] = m.row(s, st, fed);
      if (s > 0) seqs[s].allowed = bits;
      if (s == 3) seqs[s].sampling.top_logprobs = 2;
    }
    std::vector<mx::SampleResult> out(nseq);
    gpu->step(seqs, out);
    auto free_lg = gpu->last_logits(0);
    const std::vector<float> f(free_lg.begin(), free_lg.end());
    int32_t best = ids[0];
    for (int32_t id : ids)
      if (f[size_t(id)] > f[size_t(best)]) best = id;
    for (int s = 1; s < nseq; ++s) {
      auto lg = gpu->last_logits(s);
      ASSERT_EQ(int(lg.size()), V);
      for (int id = 0; id < V; ++id) {
        const bool ok = std::find(ids.begin(), ids.end(), id) != ids.end();
        ASSERT_EQ(std::isinf(lg[size_t(id)]) && lg[size_t(id)] < 0, !ok) << "row " << s << " id " << id;
      }
      EXPECT_NE(std::find(ids.begin(), ids.end(), out[s].token), ids.end()) << out[s].token;
    }
    EXPECT_EQ(out[1].token, best);
    EXPECT_EQ(out[3].token, best);
    std::vector<float> masked = f;
    for (int id = 0; id < V; ++id)
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) masked[size_t(id)] = -INFINITY;
    EXPECT_EQ(out[2].token, gpu_draw(masked, 0.8f, mx::sample_stream_key(3, uint64_t(st))));
    fed[0] = out[0].token;
  }
}
